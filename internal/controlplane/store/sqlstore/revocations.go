package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// RecordIssued records a certificate the CA issued, and forgets the
// records expired at now (store.Revocations).
func (s *Core) RecordIssued(ctx context.Context, serial, commonName string, notAfter, now time.Time) error {
	return s.tx(ctx, func(tx Execer) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO issued_certs (serial, common_name, not_after) VALUES (?, ?, ?)
			ON CONFLICT (serial) DO NOTHING`, serial, commonName, notAfter.Unix()); err != nil {
			return s.wrap("record issued certificate", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM issued_certs WHERE not_after < ?`, now.Unix()); err != nil {
			return s.wrap("record issued certificate", err)
		}
		return nil
	})
}

// revokedExpiry is the expiry a revoked serial (the first argument) is
// recorded with: the one recorded with its issue, or else the one given
// (the second; NULL: unknown).
const revokedExpiry = `COALESCE((SELECT i.not_after FROM issued_certs i WHERE i.serial = ?), ?)`

// Revoke revokes certs and the certificates recorded as issued to
// commonName that expire after expiresAfter, raising the list's number once if it revoked any, and
// returns those it revoked and those it named (store.Revocations). Each
// takes the expiry recorded with its issue, or else the one certs gives
// (revokedExpiry); so does one revoked already without an expiry. The
// number raised is at least minNumber. Revocations are serial: each
// holds the number's row.
func (s *Core) Revoke(ctx context.Context, certs []store.RevokedCert, commonName string, expiresAfter, at time.Time, minNumber int64) (added, named []string, err error) {
	var out []string
	err = s.tx(ctx, func(tx Execer) error {
		out, named = nil, nil
		var num int64
		if err := tx.QueryRowContext(ctx, `SELECT number FROM crl_number WHERE one = 1`+s.d.ForUpdate()).Scan(&num); err != nil {
			return s.wrap("revoke", err)
		}
		var all []string
		notAfter := map[string]sql.NullInt64{}
		for _, c := range certs {
			all = append(all, c.Serial)
			if !c.NotAfter.IsZero() {
				notAfter[c.Serial] = sql.NullInt64{Int64: c.NotAfter.Unix(), Valid: true}
			}
		}
		if commonName != "" {
			rows, err := tx.QueryContext(ctx, `SELECT serial FROM issued_certs WHERE common_name = ? AND not_after > ? ORDER BY serial`, commonName, expiresAfter.Unix())
			if err != nil {
				return s.wrap("revoke", err)
			}
			for rows.Next() {
				var x string
				if err := rows.Scan(&x); err != nil {
					rows.Close()
					return s.wrap("revoke", err)
				}
				all = append(all, x)
			}
			if err := errors.Join(rows.Err(), rows.Close()); err != nil {
				return s.wrap("revoke", err)
			}
		}
		seen := map[string]bool{}
		for _, x := range all {
			if x == "" || seen[x] {
				continue
			}
			seen[x] = true
			named = append(named, x)
			r, err := tx.ExecContext(ctx, `INSERT INTO revoked_certs (serial, revoked_at, not_after)
				VALUES (?, ?, `+revokedExpiry+`) ON CONFLICT (serial) DO NOTHING`, x, at.Unix(), x, notAfter[x])
			if err != nil {
				return s.wrap("revoke", err)
			}
			n, err := r.RowsAffected()
			if err != nil {
				return s.wrap("revoke", err)
			}
			if n > 0 {
				out = append(out, x)
				continue
			}
			// Revoked already: by a version that did not record the
			// expiry, it takes it now.
			if _, err := tx.ExecContext(ctx, `UPDATE revoked_certs SET not_after = `+revokedExpiry+`
				WHERE serial = ? AND not_after IS NULL`, x, notAfter[x], x); err != nil {
				return s.wrap("revoke", err)
			}
		}
		if len(out) > 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE crl_number SET number = ? WHERE one = 1`, max(num+1, minNumber)); err != nil {
				return s.wrap("revoke", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, named, nil
}

// RevocationList returns the revocation list, its entries (and those of
// unknown expiry), those expired off it and its number, read by one
// statement (store.Revocations).
func (s *Core) RevocationList(ctx context.Context) (store.RevocationList, error) {
	rows, err := s.rd().QueryContext(ctx, `SELECT c.number, r.serial, r.revoked_at, r.expired, r.not_after IS NULL FROM crl_number c LEFT JOIN revoked_certs r ON 1 = 1 WHERE c.one = 1`)
	if err != nil {
		return store.RevocationList{}, s.wrap("revocation list", err)
	}
	defer rows.Close()
	out := store.RevocationList{Revoked: map[string]time.Time{}, Expired: map[string]bool{}}
	for rows.Next() {
		var serial sql.NullString
		var at, expired sql.NullInt64
		var noExpiry sql.NullBool
		if err := rows.Scan(&out.Number, &serial, &at, &expired, &noExpiry); err != nil {
			return store.RevocationList{}, s.wrap("revocation list", err)
		}
		switch {
		case !serial.Valid:
		case expired.Int64 != 0:
			out.Expired[serial.String] = true
		default:
			out.Revoked[serial.String] = time.Unix(at.Int64, 0).UTC()
			if noExpiry.Bool {
				out.NoExpiry = append(out.NoExpiry, serial.String)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return store.RevocationList{}, s.wrap("revocation list", err)
	}
	return out, nil
}

// RaiseRevocationNumber makes the list's number at least min
// (store.Revocations).
func (s *Core) RaiseRevocationNumber(ctx context.Context, min int64) error {
	return s.tx(ctx, func(tx Execer) error {
		if _, err := tx.ExecContext(ctx, `UPDATE crl_number SET number = ? WHERE one = 1 AND number < ?`, min, min); err != nil {
			return s.wrap("raise revocation number", err)
		}
		return nil
	})
}

// ExpireRevoked drops from the list the serials whose certificates
// expired before before, raising its number once if it dropped any
// (store.Revocations). It holds the number's row, as Revoke does.
func (s *Core) ExpireRevoked(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx Execer) error {
		n = 0
		var num int64
		if err := tx.QueryRowContext(ctx, `SELECT number FROM crl_number WHERE one = 1`+s.d.ForUpdate()).Scan(&num); err != nil {
			return s.wrap("expire revoked", err)
		}
		r, err := tx.ExecContext(ctx, `UPDATE revoked_certs SET expired = 1 WHERE expired = 0 AND not_after IS NOT NULL AND not_after < ?`, before.Unix())
		if err != nil {
			return s.wrap("expire revoked", err)
		}
		if n, err = r.RowsAffected(); err != nil {
			return s.wrap("expire revoked", err)
		}
		if n > 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE crl_number SET number = ? WHERE one = 1`, num+1); err != nil {
				return s.wrap("expire revoked", err)
			}
		}
		return nil
	})
	return int(n), err
}
