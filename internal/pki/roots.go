package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// CheckCAs refuses a bundle with a certificate that is not a CA's: what
// a process takes from the control plane's answers to verify servers with
// (an agent, a borrower) must hold CA certificates only, never a leaf
// certificate whose key's holder would then be trusted as any server.
func CheckCAs(certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("pki: no CA certificate")
	}
	for _, c := range certs {
		if !c.IsCA || !c.BasicConstraintsValid {
			return fmt.Errorf("pki: %q is not a CA certificate", c.Subject.CommonName)
		}
	}
	return nil
}

// Roots is the CA certificates a long-running client that holds only the
// cluster CA's certificates (a borrower: `rialto attach`) verifies servers
// with, which may change while it runs: first those of its file
// (--cacert), then those the control plane hands out after a `rialto ca
// rotate` (Use), or the file's again once someone replaced it (Reload).
// ClientTLS is the client configuration of the certificates in use: a
// caller asks for it at each dial. Server certificates the revocation
// list held names are refused: the one beside the file (ca-crl.pem, as
// LoadClientTLS), or a newer one the control plane handed out (UseCRL),
// whichever has the higher number; the list's updates must be signed by
// a certificate in use.
//
// Zero value: not usable; use LoadRoots. Methods are safe for concurrent
// use.
type Roots struct {
	file string
	crl  *CRL
	cur  atomic.Pointer[rootSet]

	mu sync.Mutex // Use and Reload
	// The file as last read: its certificates' CertsHash, its
	// modification time and size.
	fileHash string
	fileMod  time.Time
	fileSize int64
}

// rootSet is a set of CA certificates in use.
type rootSet struct {
	certs []*x509.Certificate
	pool  *x509.CertPool
	hash  string // CertsHash(certs)
}

// newRootSet is the set of certs, in their canonical order (SortCerts).
func newRootSet(certs []*x509.Certificate) *rootSet {
	certs = SortCerts(certs)
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return &rootSet{certs: certs, pool: pool, hash: CertsHash(certs)}
}

// LoadRoots reads the CA certificates of caFile (such as a copy of
// ca-cert.pem) and watches the revocation list beside it.
func LoadRoots(caFile string) (*Roots, error) {
	st, err := os.Stat(caFile)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	certs, err := ReadCerts(caFile)
	if err != nil {
		return nil, err
	}
	crl := NewCRL(certs)
	if err := crl.Watch(filepath.Join(filepath.Dir(caFile), CRLFile)); err != nil {
		return nil, err
	}
	r := &Roots{file: caFile, crl: crl, fileHash: CertsHash(certs), fileMod: st.ModTime(), fileSize: st.Size()}
	r.cur.Store(newRootSet(certs))
	return r, nil
}

// File is the file the certificates were first read from.
func (r *Roots) File() string { return r.file }

// Certs are the CA certificates in use, in their canonical order
// (SortCerts).
func (r *Roots) Certs() []*x509.Certificate { return r.cur.Load().certs }

// Pool is a pool of the CA certificates in use: another pool once they
// changed.
func (r *Roots) Pool() *x509.CertPool { return r.cur.Load().pool }

// Hash identifies the CA certificates in use (CertsHash).
func (r *Roots) Hash() string { return r.cur.Load().hash }

// ClientTLS is a client configuration that verifies servers with the CA
// certificates in use now, and refuses those the revocation list names.
// The dialler sets ServerName (the host dialled).
func (r *Roots) ClientTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: r.Pool(), VerifyConnection: r.crl.VerifyPeer}
}

// Use makes certs the CA certificates in use, unless they already are;
// it reports whether they changed. A bundle holding a certificate that is
// not a CA's is refused (CheckCAs). The caller vouches for where they
// came from: an answer of the control plane over a connection it verified
// with the certificates in use, never anything a data-plane peer said.
func (r *Roots) Use(certs []*x509.Certificate) (bool, error) {
	if err := CheckCAs(certs); err != nil {
		return false, err
	}
	var dropped bool
	defer func() { r.endUntrusted(dropped) }() // after the unlock
	r.mu.Lock()
	defer r.mu.Unlock()
	if CertsHash(certs) == r.Hash() {
		return false, nil
	}
	dropped = r.set(certs)
	return true, nil
}

// Reload reads the file again if it changed since it was last read, and
// makes its certificates the ones in use if they are others than it held
// then: an operator's new file wins over what the control plane handed
// out, and a file touched but holding the same certificates does not. It
// reports whether the certificates in use changed.
func (r *Roots) Reload() (bool, error) {
	var dropped bool
	defer func() { r.endUntrusted(dropped) }() // after the unlock
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := os.Stat(r.file)
	if err != nil {
		return false, fmt.Errorf("pki: %w", err)
	}
	if st.ModTime().Equal(r.fileMod) && st.Size() == r.fileSize {
		return false, nil
	}
	certs, err := ReadCerts(r.file)
	if err != nil {
		return false, err // read again next time
	}
	r.fileMod, r.fileSize = st.ModTime(), st.Size()
	h := CertsHash(certs)
	if h == r.fileHash {
		return false, nil
	}
	r.fileHash = h
	if h == r.Hash() {
		return false, nil
	}
	dropped = r.set(certs)
	return true, nil
}

// UseCRL makes the revocation list crlPEM (an X.509 CRL, PEM) the one
// held if a CA certificate in use signed it and its number is higher than
// that of the list held (the file's, or one taken before); it reports
// whether it did. A list of another CA is refused (an error); an older
// one, or the one held, is not taken (false, no error). From then on
// ClientTLS refuses the server certificates it names. As with Use, the
// caller vouches for where it came from: an answer of the control plane
// over a connection it verified with the certificates in use.
func (r *Roots) UseCRL(crlPEM []byte) (bool, error) { return r.crl.Update(crlPEM) }

// CRLNumber is the number of the revocation list held (nil: none), the
// file's if it changed since (the higher number wins).
func (r *Roots) CRLNumber() *big.Int { return r.crl.Number() }

// set makes certs the certificates in use (r.mu held); it reports
// whether they lack one held before (a CA dropped): the caller then ends
// the tracked connections its certificates alone vouched for, once it
// has let go of r.mu (endUntrusted), for their end functions may use r.
func (r *Roots) set(certs []*x509.Certificate) (dropped bool) {
	r.cur.Store(newRootSet(certs))
	return r.crl.setRoots(certs)
}

// endUntrusted ends the tracked connections whose peers chain to none of
// the certificates in use, if a CA was dropped (see set); r.mu not held.
func (r *Roots) endUntrusted(dropped bool) {
	if dropped {
		r.crl.endUntrusted()
	}
}
