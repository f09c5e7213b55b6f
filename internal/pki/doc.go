// Package pki is Rialto's cluster certificate authority: it creates a CA in
// a state directory, issues server and client certificates from it, signs
// certificate signing requests with short lifetimes, keeps a persisted
// revocation list, and builds the crypto/tls configurations that verify
// against it.
//
// Keys are ECDSA P-256: Go's crypto/tls, GnuTLS (libnbd's nbdinfo and
// nbdcopy, nbdkit, qemu's tls-creds-x509) and OpenSSL (curl) all accept
// them. Ed25519 would be shorter, but browsers (Chromium among them) do not
// accept Ed25519 certificates, and the API may be opened in one.
//
// A CA directory holds, in the file names libnbd, nbdkit and qemu expect:
//
//	ca-cert.pem   the trusted CA certificates, newest first ([SortCerts]:
//	              after a rotation, the new, signing CA, then older CA
//	              certificates until dropped)
//	ca-key.pem    the signing CA's private key (0600)
//	ca-crl.pem    the revocation list, an X.509 CRL signed by the CA
//	issued.txt    the certificates issued and not yet expired (serial,
//	              expiry, common name; 0600), so that [CA.RevokeIssuedTo]
//	              revokes every certificate of a holder
//
// The directory is 0700. Issued private keys are returned to the caller
// (and written 0600 by [WriteFiles]); the CA never stores them.
//
// Revocation: [CA.Revoke] adds a serial number to the list and re-signs
// ca-crl.pem; [CA.VerifyPeer] (installed by the tls.Config helpers) refuses a
// revoked certificate, and third-party tools can load ca-crl.pem. Serial
// numbers are 128 random bits, so one list covers certificates of every CA
// generation. Processes that hold only the CA's certificates check peers
// with a [CRL]: [LoadClientTLS] (a borrower) watches the ca-crl.pem beside
// ca-cert.pem, an agent keeps the list the control plane hands it. A
// long-running borrower holds its CA certificates as [Roots], which take
// the control plane's after a rotation ([Roots.Use]: CA certificates only,
// [CheckCAs]) or an operator's new file ([Roots.Reload]), and the control
// plane's revocation list when it is newer than the one beside the file
// ([Roots.UseCRL]: signed by a CA certificate in use). A handshake
// checks the peer against the list held then; a connection made before
// a revocation is ended when a list naming its peer's certificate is
// taken, if it was registered with the list's [CRL.Tracker] (a borrower's
// connections to its lenders: [Roots.Tracker]), and so is one whose
// peer's certificate chains to none of the CA certificates left once a
// [CA.DropOld] is followed ([CRL.SetRoots], [ErrUntrusted]); a server
// checks each request of a connection against both with [CRL.CheckConn]
// (the agent's API). Holders
// of copies of one CA directory that share a record of the list elsewhere
// (the control plane's replicas, in their store) sign that list with its
// own number ([CA.Adopt]), so that each copy's ca-crl.pem is the same
// list under the same number; [CA.IssuedTo] lists a holder's certificates
// in the index.
//
// Rotation: [CA.Rotate] makes a new signing key and certificate and keeps
// the old CA certificate in ca-cert.pem, so that certificates issued before
// still verify while they are renewed from the new CA; once every holder has
// a new certificate (at most one leaf lifetime later), [CA.DropOld] removes
// the old CA certificates. Clients that pinned ca-cert.pem must fetch it
// again after a rotation (agents and `rialto attach` take it from the
// control plane).
//
// Zero value: a zero CA is not usable; use [Open] or [Load].
//
// Concurrency: CA methods are safe for concurrent use. Methods that change
// the directory (Open creating it, Revoke, Rotate, DropOld) also take an
// advisory lock on it (dir/.lock), so that two processes sharing a CA
// directory do not overwrite each other's changes.
package pki
