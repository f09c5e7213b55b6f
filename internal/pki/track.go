package pki

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"slices"
	"sync"
)

// TrackFunc registers a live TLS connection with a revocation list (see
// CRL.Tracker), once its handshake is done: peer names the other end for
// logs (an address), cs is the connection's state (the certificate the
// peer presented, cs.PeerCertificates[0]) and end ends the connection,
// given why. It returns the function to call when the connection ended
// otherwise (idempotent), or an error when the list held now revokes the
// peer's certificate (ErrRevoked: a list taken since the handshake
// verified it; the caller ends the connection as if the handshake had
// failed), or when that certificate chains to none of the CA
// certificates the list holds now (ErrUntrusted: its CA was dropped since
// the handshake, CRL.SetRoots). A connection whose peer presented no
// certificate has nothing to revoke: it is not tracked.
type TrackFunc func(peer string, cs tls.ConnectionState, end func(error)) (untrack func(), err error)

// liveConns are the connections tracked with a CRL, by the serial number
// (hex) of their peer's certificate. Lock order: mu, then the CRL's.
type liveConns struct {
	mu       sync.Mutex
	bySerial map[string]map[*liveConn]struct{}
	// swept is the list (CRL.gen) the last walk ended connections by.
	swept uint64
}

// liveConn is one connection tracked.
type liveConn struct {
	peer string
	cert *x509.Certificate
	end  func(error)
	log  *slog.Logger
	// cs is the connection's state: the chains its handshake verified,
	// the intermediates its peer presented (chainsTo).
	cs tls.ConnectionState
}

// Tracker returns the function that registers live TLS connections with
// the list (TrackFunc): once a later list the CRL takes (Update, a
// changed watched file read at a check) names the serial number of the
// certificate a tracked connection's peer presented, that connection is
// ended (its end function is called, outside any lock of the CRL, by the
// caller that made the CRL take the list) and the end is logged to log
// (nil: discarded), naming the peer and the serial number. The handshake
// checks a certificate against the list held then; this ends what it let
// through before a revocation: a borrower's connections to a lender whose
// node was removed. (A server checks its clients' certificates per
// request instead: CheckConn.)
// Likewise, once the CA certificates the list holds lack one held before
// (SetRoots: a `rialto ca drop-old` a borrower's Roots or an agent
// followed), a tracked connection whose peer's certificate chains to none
// of those left is ended, by the caller of SetRoots, and logged ("no
// longer trusted: its CA was dropped", naming the peer, the serial number
// and the issuer), ending with ErrUntrusted.
func (c *CRL) Tracker(log *slog.Logger) TrackFunc {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(peer string, cs tls.ConnectionState, end func(error)) (func(), error) {
		return c.track(log, peer, cs, end)
	}
}

func (c *CRL) track(log *slog.Logger, peer string, cs tls.ConnectionState, end func(error)) (func(), error) {
	if len(cs.PeerCertificates) == 0 {
		return func() {}, nil
	}
	cert := cs.PeerCertificates[0]
	serial := cert.SerialNumber.Text(16)
	// A list the check below took ends the connections it revokes, once
	// this one is registered or refused.
	defer c.endRevoked()
	c.live.mu.Lock()
	defer c.live.mu.Unlock()
	// Checked under c.live.mu: a list taken after this check is walked
	// (endRevoked) once this connection is in the set.
	if err := c.check(cert); err != nil {
		return nil, err
	}
	// Checked under c.live.mu too: CA certificates dropped after this
	// check are walked (endUntrusted) once this connection is in the set.
	if err := c.checkChain(cs); err != nil {
		return nil, err
	}
	lc := &liveConn{peer: peer, cert: cert, end: end, log: log, cs: cs}
	if c.live.bySerial == nil {
		c.live.bySerial = map[string]map[*liveConn]struct{}{}
	}
	set := c.live.bySerial[serial]
	if set == nil {
		set = map[*liveConn]struct{}{}
		c.live.bySerial[serial] = set
	}
	set[lc] = struct{}{}
	return func() {
		c.live.mu.Lock()
		defer c.live.mu.Unlock()
		if set := c.live.bySerial[serial]; set != nil {
			delete(set, lc)
			if len(set) == 0 {
				delete(c.live.bySerial, serial)
			}
		}
	}, nil
}

// endRevoked ends the tracked connections whose peer's certificate the
// list held revokes, if the list changed since it last looked. Called by
// every method that may have taken a list, once it let go of c.mu.
func (c *CRL) endRevoked() {
	c.live.mu.Lock()
	c.mu.Lock()
	gen, revoked, number := c.gen, c.revoked, c.number
	c.mu.Unlock()
	if gen == c.live.swept {
		c.live.mu.Unlock()
		return
	}
	c.live.swept = gen
	var ended []*liveConn
	for serial, set := range c.live.bySerial {
		if !revoked[serial] {
			continue
		}
		for lc := range set {
			ended = append(ended, lc)
		}
		delete(c.live.bySerial, serial)
	}
	c.live.mu.Unlock()
	for _, lc := range ended {
		serial := lc.cert.SerialNumber.Text(16)
		lc.log.Warn("ending a TLS connection: its peer's certificate is revoked", "peer", lc.peer, "serial", serial,
			"subject", lc.cert.Subject.CommonName, "crl_number", number.String())
		lc.end(fmt.Errorf("%w: serial %s (%s), by revocation list %s", ErrRevoked, serial, lc.cert.Subject.CommonName, number))
	}
}

// Tracker returns the function that registers live TLS connections with
// the revocation list held (CRL.Tracker): a connection to a server whose
// certificate a later list names (the file's, or the control plane's:
// UseCRL) is ended, and so is one to a server whose certificate's CA the
// certificates in use no longer hold (Use, Reload after a `rialto ca
// drop-old`).
func (r *Roots) Tracker(log *slog.Logger) TrackFunc { return r.crl.Tracker(log) }

// CheckConn refuses the peer of a connection made before now whose
// certificate the list held now revokes (ErrRevoked), or which chains to
// none of the CA certificates the list holds now (ErrUntrusted: its CA
// was dropped since the handshake, SetRoots). A server calls it on each
// request of a connection (the agent's API): what the handshake let
// through, a later list or a narrower CA bundle refuses then. It costs a
// lookup by serial number and a comparison of the CA certificates that
// ended the chains the handshake verified. A connection whose peer
// presented no certificate passes.
func (c *CRL) CheckConn(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	if err := c.Check(cs.PeerCertificates[0]); err != nil {
		return err
	}
	return c.checkChain(cs)
}

// checkChain refuses the peer of cs whose certificate chains to none of
// the CA certificates held now (ErrUntrusted).
func (c *CRL) checkChain(cs tls.ConnectionState) error {
	c.mu.Lock()
	roots := c.roots
	c.mu.Unlock()
	if chainsTo(cs, roots) {
		return nil
	}
	leaf := cs.PeerCertificates[0]
	return fmt.Errorf("%w: serial %s (%s), issued by %q, which the CA certificates in use no longer hold",
		ErrUntrusted, leaf.SerialNumber.Text(16), leaf.Subject.CommonName, leaf.Issuer.CommonName)
}

// chainsTo reports whether the certificate the peer of cs presented
// chains to one of roots: a chain the handshake verified ends at one of
// them, or (none does: a root of then dropped, or a connection that
// pinned its peer's key rather than verify a chain) it or an
// intermediate the peer presented is signed by one of them. Signatures
// only: validity periods were the handshake's to check, and a
// connection is not ended here for its peer's certificate expiring.
func chainsTo(cs tls.ConnectionState, roots []*x509.Certificate) bool {
	for _, chain := range cs.VerifiedChains {
		if len(chain) > 0 && slices.ContainsFunc(roots, chain[len(chain)-1].Equal) {
			return true
		}
	}
	if len(cs.PeerCertificates) == 0 {
		return false
	}
	return signedBy(cs.PeerCertificates[0], cs.PeerCertificates[1:], roots, len(cs.PeerCertificates)-1)
}

// signedBy reports whether cert is one of roots or signed by one, or
// signed by one of inter that is, through at most depth intermediates.
func signedBy(cert *x509.Certificate, inter, roots []*x509.Certificate, depth int) bool {
	for _, r := range roots {
		if cert.Equal(r) || cert.CheckSignatureFrom(r) == nil {
			return true
		}
	}
	if depth == 0 {
		return false
	}
	for _, i := range inter {
		if !i.Equal(cert) && cert.CheckSignatureFrom(i) == nil && signedBy(i, inter, roots, depth-1) {
			return true
		}
	}
	return false
}

// endUntrusted ends the tracked connections whose peer's certificate
// chains to none of the CA certificates held: SetRoots calls it, once it
// let go of c.mu, when the certificates it took lack one held before (a
// CA dropped: `rialto ca drop-old`).
func (c *CRL) endUntrusted() {
	c.live.mu.Lock()
	c.mu.Lock()
	roots := c.roots
	c.mu.Unlock()
	var ended []*liveConn
	for serial, set := range c.live.bySerial {
		for lc := range set {
			if chainsTo(lc.cs, roots) {
				continue
			}
			ended = append(ended, lc)
			delete(set, lc)
		}
		if len(set) == 0 {
			delete(c.live.bySerial, serial)
		}
	}
	c.live.mu.Unlock()
	for _, lc := range ended {
		serial := lc.cert.SerialNumber.Text(16)
		lc.log.Warn("ending a TLS connection: its peer's certificate is no longer trusted: its CA was dropped", "peer", lc.peer, "serial", serial,
			"subject", lc.cert.Subject.CommonName, "issuer", lc.cert.Issuer.CommonName)
		lc.end(fmt.Errorf("%w: serial %s (%s), issued by %q, which the CA certificates in use no longer hold",
			ErrUntrusted, serial, lc.cert.Subject.CommonName, lc.cert.Issuer.CommonName))
	}
}
