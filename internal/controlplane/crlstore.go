package controlplane

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"

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

// crlSync serializes a Server's syncCRL.
type crlSync struct{ mu sync.Mutex }

// recordIssued records a node certificate this replica issued in the
// store, before it is handed out: another replica removing the node then
// revokes it.
func (s *Server) recordIssued(ctx context.Context, iss *pki.Issued) error {
	rv, ok := s.st.(store.Revocations)
	if !ok {
		return nil
	}
	if err := rv.RecordIssued(ctx, iss.Cert.SerialNumber.Text(16), iss.Cert.Subject.CommonName, iss.Cert.NotAfter, s.now()); err != nil {
		return fmt.Errorf("controlplane: record the certificate issued to %s: %w", iss.Cert.Subject.CommonName, err)
	}
	return nil
}

// revokeCerts revokes serials and, with node set, every certificate
// issued to node (those the store recorded, whichever replica issued
// them, and those in this replica's issued.txt), and returns those it
// revoked that were not revoked already. With a store that keeps the list
// it records them there and signs this replica's list from it; this
// replica refuses them once revokeCerts returns without an error.
func (s *Server) revokeCerts(ctx context.Context, node string, serials []*big.Int) ([]*big.Int, error) {
	ca := s.cfg.CA
	rv, ok := s.st.(store.Revocations)
	if !ok {
		var out []*big.Int
		if node != "" {
			var err error
			if out, err = ca.RevokeIssuedTo(node); err != nil {
				return nil, err
			}
		}
		for _, n := range serials {
			if ca.Revoked(n) {
				continue
			}
			if err := ca.Revoke(n); err != nil {
				return out, err
			}
			out = append(out, n)
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
	texts, err := rv.Revoke(ctx, serialTexts(all), node, s.now())
	if err != nil {
		return nil, fmt.Errorf("controlplane: record the revocation: %w", err)
	}
	out := parseSerials(texts)
	if _, err := s.syncCRL(ctx); err != nil {
		// The store holds them: the next sync signs them. Refuse them
		// here meanwhile.
		s.log.Warn("signing the revocation list from the store; revoking in this replica's CA directory only meanwhile", "err", err)
		for _, n := range out {
			if err := ca.Revoke(n); err != nil {
				return out, fmt.Errorf("controlplane: revoke in the CA directory: %w", err)
			}
		}
	}
	return out, nil
}

// maxCRLSyncRounds bounds syncCRL's rounds: each round adds to the store
// what this replica's directory revoked that the store lacks, or raises
// the store's number to the directory's, and another process may change
// either meanwhile.
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
// before the store kept the list.
func (s *Server) syncCRL(ctx context.Context) (bool, error) {
	ca := s.cfg.CA
	if ca == nil {
		return false, nil
	}
	rv, ok := s.st.(store.Revocations)
	if !ok {
		return ca.ReloadIfChanged()
	}
	s.crl.mu.Lock()
	defer s.crl.mu.Unlock()
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
}

// caListError is an error of the CA directory's list (pki.CA.Adopt), not
// the store's: re-reading the directory would only repeat it.
type caListError struct{ err error }

func (e caListError) Error() string { return e.err.Error() }
func (e caListError) Unwrap() error { return e.err }

// adoptStoreCRL is syncCRL's work with a store that keeps the list.
func (s *Server) adoptStoreCRL(ctx context.Context, ca *pki.CA, rv store.Revocations) (bool, error) {
	for range maxCRLSyncRounds {
		l, err := rv.RevocationList(ctx)
		if err != nil {
			return false, fmt.Errorf("controlplane: revocation list: %w", err)
		}
		a, err := ca.Adopt(pki.SharedList{Number: big.NewInt(l.Number), Revoked: l.Revoked})
		if err != nil {
			return false, caListError{err}
		}
		switch {
		case len(a.Missing) > 0:
			if _, err := rv.Revoke(ctx, serialTexts(a.Missing), "", s.now()); err != nil {
				return false, fmt.Errorf("controlplane: record the revocations of the CA directory: %w", err)
			}
		case a.MinNumber != nil:
			if !a.MinNumber.IsInt64() {
				return false, fmt.Errorf("controlplane: the CA directory's revocation list number %s is too large for the store", a.MinNumber)
			}
			if err := rv.RaiseRevocationNumber(ctx, a.MinNumber.Int64()); err != nil {
				return false, fmt.Errorf("controlplane: revocation list: %w", err)
			}
		default:
			return a.Changed, nil
		}
	}
	return false, errors.New("controlplane: the revocation list kept changing while this replica signed it")
}
