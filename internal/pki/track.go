package pki

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
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
// failed). A connection whose peer presented no certificate has nothing
// to revoke: it is not tracked.
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
// node was removed, a server's to a client whose certificate was revoked.
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
	lc := &liveConn{peer: peer, cert: cert, end: end, log: log}
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
// UseCRL) is ended.
func (r *Roots) Tracker(log *slog.Logger) TrackFunc { return r.crl.Tracker(log) }
