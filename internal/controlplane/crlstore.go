package controlplane

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/pki"
)

// This file keeps the cluster CA's revocation list in the store
// (store.Revocations), so that replicas each holding a copy of the CA
// directory agree on it (docs/operations.md, "Revocation across
// replicas"): the node certificates a replica issues are recorded there,
// so that any replica revokes them by the node's ID; every revocation is
// recorded there, with the list's CRL number raised; and every replica
// signs its ca-crl.pem with the store's entries and number (syncCRL), so
// that an agent, which takes the list with the higher number, takes the
// same list from any replica. A store without the capability leaves the
// CA directory the only record, as before.

// crlSync shares a Server's syncCRL among its concurrent callers (every
// request with a client certificate calls it while the replica does not
// trust its cache): one sync runs at a time, and the callers arriving
// while it runs wait for the next one, which starts once it ended, and
// which they all share. None takes for its own a sync that read the store
// before it arrived, and each sees that sync's error (fail closed).
type crlSync struct {
	mu      sync.Mutex
	token   chan struct{} // held by the sync running (capacity 1)
	pending *crlRun       // the next sync, not started yet (nil: none)
	runs    int           // syncs run
	joined  func()        // tests: called once a caller waits for a sync
}

// crlRun is one sync, shared by the callers that wait for it.
type crlRun struct {
	done    chan struct{} // closed once it ran
	changed bool
	err     error
}

// do runs run, or waits for the sync that the callers arriving since the
// last one started share, and returns its result.
func (c *crlSync) do(ctx context.Context, run func(context.Context) (bool, error)) (bool, error) {
	for {
		c.mu.Lock()
		if c.token == nil {
			c.token = make(chan struct{}, 1)
		}
		r := c.pending
		if r == nil {
			r = &crlRun{done: make(chan struct{})}
			c.pending = r
		}
		token, joined := c.token, c.joined
		c.mu.Unlock()
		if joined != nil {
			joined()
		}
		select {
		case token <- struct{}{}:
		case <-r.done:
			if ctx.Err() == nil && isContextErr(r.err) {
				continue // its runner's request ended, not this one's
			}
			return r.changed, r.err
		case <-ctx.Done():
			return false, fmt.Errorf("controlplane: waiting to sign the revocation list: %w", context.Cause(ctx))
		}
		c.mu.Lock()
		if c.pending != r {
			// Another caller ran r and let the token go: it is done.
			c.mu.Unlock()
			<-token
			if ctx.Err() == nil && isContextErr(r.err) {
				continue
			}
			return r.changed, r.err
		}
		c.pending = nil
		c.runs++
		c.mu.Unlock()
		r.changed, r.err = run(ctx)
		close(r.done)
		<-token
		return r.changed, r.err
	}
}

// isContextErr reports whether err is a context's end.
func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// recordIssued records a node certificate this replica issued in the
// store, before it is handed out: another replica removing the node then
// revokes it. The store forgets the records of certificates expired
// more than revokedExpiryGrace ago, not sooner: finishRemovals revokes
// those expired less long ago that no revocation names.
func (s *Server) recordIssued(ctx context.Context, iss *pki.Issued) error {
	rv, ok := s.st.(store.Revocations)
	if !ok {
		return nil
	}
	if err := rv.RecordIssued(ctx, iss.Cert.SerialNumber.Text(16), iss.Cert.Subject.CommonName, iss.Cert.NotAfter, s.now().Add(-revokedExpiryGrace)); err != nil {
		return fmt.Errorf("controlplane: record the certificate issued to %s: %w", iss.Cert.Subject.CommonName, err)
	}
	return nil
}

// revokeCerts revokes serials and, with node set, every certificate
// issued to node not expired, or expired less than revokedExpiryGrace
// ago, as the revocation list keeps them and the sweep's finishRemovals
// takes them (those the store recorded, whichever replica issued them,
// and those in this replica's issued.txt), and returns every
// one of them, revoked already or now: a removal tried again (an earlier
// attempt recorded them in the store, then failed) reports, records and
// broadcasts them too. With a store that keeps the list it records them
// there and signs this replica's list from it, or, should that fail,
// revokes them in this replica's CA directory; this replica refuses them
// once revokeCerts returns without an error.
func (s *Server) revokeCerts(ctx context.Context, node string, serials []*big.Int) ([]*big.Int, error) {
	ca := s.cfg.CA
	rv, ok := s.st.(store.Revocations)
	if !ok {
		out := slices.Clone(serials)
		if node != "" {
			if _, err := ca.RevokeIssuedTo(node); err != nil {
				return nil, err
			}
			issued, err := ca.IssuedTo(node)
			if err != nil {
				return nil, err
			}
			out = append(out, issued...)
		}
		out = uniqueSerials(out)
		for _, n := range out {
			if ca.Revoked(n) {
				continue
			}
			if err := ca.Revoke(n); err != nil {
				return out, err
			}
		}
		return out, nil
	}
	all := slices.Clone(serials)
	if node != "" {
		// Those issued before the store recorded issues (an upgrade).
		local, err := ca.IssuedTo(node)
		if err != nil {
			return nil, err
		}
		all = append(all, local...)
	}
	certs, err := revokedCerts(ca, all)
	if err != nil {
		return nil, err
	}
	_, named, err := rv.Revoke(ctx, certs, node, s.now().Add(-revokedExpiryGrace), s.now(), 0)
	if err != nil {
		return nil, fmt.Errorf("controlplane: record the revocation: %w", err)
	}
	out := parseSerials(named)
	if _, err := s.syncCRL(ctx); err != nil {
		// The store holds them: the next sync signs them. Refuse them
		// here meanwhile: every one named, those the store held already
		// too (this replica may not have signed them yet).
		s.log.Warn("signing the revocation list from the store; revoking in this replica's CA directory only meanwhile", "err", err)
		for _, n := range out {
			if ca.Revoked(n) {
				continue
			}
			if err := ca.Revoke(n); err != nil {
				return out, fmt.Errorf("controlplane: revoke in the CA directory: %w", err)
			}
		}
	}
	return out, nil
}

// maxCRLSyncRounds bounds syncCRL's rounds: each round adds to the store
// what this replica's directory revoked that the store lacks (with the
// store's number raised above the directory's), or raises the store's
// number above the directory's, and another process may change either
// meanwhile.
const maxCRLSyncRounds = 4

// syncCRL signs this replica's revocation list (ca-crl.pem, re-read)
// from the store's (pki.CA.Adopt), after recording in the store what the
// directory's list revokes that the store's does not (another process
// sharing the directory, a replica's revocation before the store kept
// them) and raising the
// store's number above the directory's where that is higher. It reports
// whether this replica's list changed. Without a store that keeps the
// list, it re-reads ca-crl.pem (another process sharing the directory may
// have written it); so it does when the store fails, which it reports:
// a revocation by such a process takes effect here meanwhile, as it did
// before the store kept the list. Concurrent callers share one sync that
// started after they called (crlSync).
func (s *Server) syncCRL(ctx context.Context) (bool, error) {
	ca := s.cfg.CA
	if ca == nil {
		return false, nil
	}
	rv, ok := s.st.(store.Revocations)
	if !ok {
		return ca.ReloadIfChanged()
	}
	return s.crl.do(ctx, func(ctx context.Context) (bool, error) {
		changed, err := s.adoptStoreCRL(ctx, ca, rv)
		var cerr caListError
		if err != nil && !errors.As(err, &cerr) {
			// The store failed: the directory's list may still be read.
			if reloaded, rerr := ca.ReloadIfChanged(); rerr != nil {
				err = errors.Join(err, rerr)
			} else {
				changed = changed || reloaded
			}
		}
		return changed, err
	})
}

// caListError is an error of the CA directory's list (pki.CA.Adopt), not
// the store's: re-reading the directory would only repeat it.
type caListError struct{ err error }

func (e caListError) Error() string { return e.err.Error() }
func (e caListError) Unwrap() error { return e.err }

// adoptStoreCRL is syncCRL's work with a store that keeps the list.
func (s *Server) adoptStoreCRL(ctx context.Context, ca *pki.CA, rv store.Revocations) (bool, error) {
	dated := false
	for range maxCRLSyncRounds {
		l, err := rv.RevocationList(ctx)
		if err != nil {
			return false, fmt.Errorf("controlplane: revocation list: %w", err)
		}
		if len(l.NoExpiry) > 0 && !dated {
			dated = true
			s.dateRevoked(ctx, ca, rv, l.NoExpiry)
		}
		a, err := ca.Adopt(pki.SharedList{Number: big.NewInt(l.Number), Revoked: l.Revoked, Expired: l.Expired})
		if err != nil {
			return false, caListError{err}
		}
		var minNum int64
		if a.MinNumber != nil {
			if !a.MinNumber.IsInt64() {
				return false, fmt.Errorf("controlplane: the CA directory's revocation list number %s is too large for the store", a.MinNumber)
			}
			minNum = a.MinNumber.Int64()
		}
		switch {
		case len(a.Missing) > 0:
			certs, err := revokedCerts(ca, a.Missing)
			if err != nil {
				return false, fmt.Errorf("controlplane: the expiry of the CA directory's revocations: %w", err)
			}
			// Under the directory's list's number raised at once (minNum):
			// raised by one, the store's list could take that number
			// without what it held that the directory's lacks.
			if _, _, err := rv.Revoke(ctx, certs, "", time.Time{}, s.now(), minNum); err != nil {
				return false, fmt.Errorf("controlplane: record the revocations of the CA directory: %w", err)
			}
		case a.MinNumber != nil:
			if err := rv.RaiseRevocationNumber(ctx, minNum); err != nil {
				return false, fmt.Errorf("controlplane: revocation list: %w", err)
			}
		default:
			return a.Changed, nil
		}
	}
	return false, errors.New("controlplane: the revocation list kept changing while this replica signed it")
}

// dateRevoked gives the serials on the store's list whose expiry it does
// not know (revoked by a version before it recorded expiries:
// store.RevocationList.NoExpiry) the expiry a revocation of them now
// would record (revokedCerts, and the store's record of their issue),
// so that they leave the list once expired (expireRevoked), as the
// others do. The list's entries and number do not change. A failure is
// logged: they stay on the list until a later sync dates them.
func (s *Server) dateRevoked(ctx context.Context, ca *pki.CA, rv store.Revocations, noExpiry []string) {
	serials := parseSerials(noExpiry)
	certs, err := revokedCerts(ca, serials)
	if err == nil {
		_, _, err = rv.Revoke(ctx, certs, "", time.Time{}, s.now(), 0)
	}
	if err != nil {
		s.log.Warn("recording the expiry of revoked certificates revoked without one", "certificates", len(serials), "err", err)
		return
	}
	s.log.Info("recorded the expiry of revoked certificates revoked without one", "certificates", len(serials))
}

// revokedCerts are serials with their certificates' expiry as ca knows
// it (pki.CA.NotAfter: its issued.txt, or the latest expiry of its CA
// certificates for a serial it does not list), for the store's list,
// which drops them once expired (expireRevoked); the store prefers the
// expiry it recorded with an issue.
func revokedCerts(ca *pki.CA, serials []*big.Int) ([]store.RevokedCert, error) {
	notAfter, err := ca.NotAfter(serials)
	if err != nil {
		return nil, err
	}
	out := make([]store.RevokedCert, len(serials))
	for i, n := range serials {
		out[i] = store.RevokedCert{Serial: n.Text(16), NotAfter: notAfter[i]}
	}
	return out, nil
}

// uniqueSerials is serials without repeats, in their first order.
func uniqueSerials(serials []*big.Int) []*big.Int {
	seen := map[string]bool{}
	out := serials[:0:0]
	for _, n := range serials {
		if k := n.Text(16); !seen[k] {
			seen[k] = true
			out = append(out, n)
		}
	}
	return out
}

// revokedExpiryGrace is how long after a revoked certificate's expiry the
// store's list keeps naming it: a peer whose clock is behind the control
// plane's by less still refuses it.
const revokedExpiryGrace = time.Hour

// expireRevoked drops from the store's revocation list the certificates
// that expired more than revokedExpiryGrace before now (an expired
// certificate is refused anyway: the control plane, the agents and the
// data planes verify a peer's certificate against the CA and its validity
// period before they look it up in the list), under a higher number;
// the next sync signs each replica's list without them. Those revoked
// without a known expiry (before the store recorded it) are given one by
// a sync (dateRevoked).
func (s *Server) expireRevoked(ctx context.Context, now time.Time) {
	rv, ok := s.st.(store.Revocations)
	if !ok {
		return
	}
	if n, err := rv.ExpireRevoked(ctx, now.Add(-revokedExpiryGrace)); err != nil {
		s.log.Warn("dropping expired certificates from the revocation list", "err", err)
	} else if n > 0 {
		s.log.Info("expired certificates dropped from the revocation list", "certificates", n)
	}
}
