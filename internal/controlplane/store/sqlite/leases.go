package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// The lease writes run under Store.leaseMu, which serializes them with
// their updates of the live cache (live.go); the writes that change a
// lease's row other than by a transition make it leave the cache.

// LeaseOps applies lease creations and transitions in one write
// transaction (group commit), each as CreateLease or TransitionLease would
// and independently of the others (sqlstore.Core.WriteOps); a transition
// of a lease whose committed value is cached writes its row without
// reading it back.
func (s *Store) LeaseOps(ctx context.Context, ops []store.LeaseOp) (out []api.Lease, errs []error, err error) {
	texts := s.OpTexts(ops) // outside the transaction: the writer is serial
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	out, errs, err = s.WriteOps(ctx, ops, texts, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	staged := make([]api.Lease, 0, len(ops))
	for i := range ops {
		if errs[i] == nil {
			staged = append(staged, out[i])
		}
	}
	s.live.update(staged)
	for i := range out {
		out[i] = sqlstore.CopyLease(out[i]) // the cache keeps its own
	}
	return out, errs, nil
}

// ReplaceParts swaps a non-terminal lease's parts for new ones.
func (s *Store) ReplaceParts(ctx context.Context, id string, parts []api.Part, plan *api.Plan, at time.Time, ev api.Event) (api.Lease, error) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	defer s.live.drop(id) // read back from the row next time
	return s.Core.ReplaceParts(ctx, id, parts, plan, at, ev)
}

// BeginMove records an open move and reserves its destination.
func (s *Store) BeginMove(ctx context.Context, m api.Move, ev api.Event) error {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.Core.BeginMove(ctx, m, ev)
}

// FinishMove makes an open move's destination its lease's part.
func (s *Store) FinishMove(ctx context.Context, id, uri string, at time.Time, ev api.Event) (api.Lease, error) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	l, err := s.Core.FinishMove(ctx, id, uri, at, ev)
	if l.ID != "" {
		s.live.drop(l.ID) // read back from the row next time
	}
	return l, err
}

// AdoptPart makes what a lender holds of an active lease its part.
func (s *Store) AdoptPart(ctx context.Context, m api.Move, uri string, ev api.Event) (api.Lease, error) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	defer s.live.drop(m.LeaseID) // read back from the row next time
	return s.Core.AdoptPart(ctx, m, uri, ev)
}

// EndMove records a move's end.
func (s *Store) EndMove(ctx context.Context, id, state, errMsg string, copied int64, at time.Time, ev *api.Event) error {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.Core.EndMove(ctx, id, state, errMsg, copied, at, ev)
}

// InsertLease writes a new lease's row, its plan and its parts: a
// statement each (prepared once: sqlite.go).
func (d dialect) InsertLease(ctx context.Context, tx execer, n store.NewLease, text sqlstore.OpText) error {
	l, dm := n.Lease, n.Demand
	_, err := tx.ExecContext(ctx, `INSERT INTO leases (`+sqlstore.LeaseInsertCols+`, demand_bps, work_bytes, deadline_at, gateway) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		l.ID, l.State, l.Kind, l.Mode, l.Tenant, l.Borrower, l.Size, l.StripeUnit, l.BandwidthCap, l.IOPSCap, l.URI, l.Credential, l.TTLSeconds,
		ns(l.ExpiresAt), ns(l.CreatedAt), ns(l.UpdatedAt), l.Reason, l.IdempotencyKey, text.Parts, dm.Bandwidth, dm.Work, ns(dm.Deadline), dm.Gateway)
	if err != nil {
		return fmt.Errorf("sqlite: create lease: %w", err)
	}
	if text.Plan != "" {
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_plans (created_at, lease_id, plan) VALUES (?, ?, ?)`, ns(l.CreatedAt), l.ID, text.Plan); err != nil {
			return fmt.Errorf("sqlite: lease plan: %w", err)
		}
	}
	return d.s.InsertParts(ctx, tx, l.ID, l.Parts)
}

// applyChange is what a transition's UPDATE does to the row, applied to
// its value; false if it cannot tell (more URIs than parts).
func (s *Store) applyChange(l api.Lease, ch store.LeaseChange, plan string) (api.Lease, bool) {
	if len(ch.URIs) > len(l.Parts) {
		return l, false
	}
	l.State, l.UpdatedAt = ch.To, tm(ns(ch.At))
	if ch.Reason != "" {
		l.Reason = ch.Reason
	}
	if ch.URI != "" {
		l.URI = ch.URI
	}
	if !ch.ExpiresAt.IsZero() {
		l.ExpiresAt = tm(ns(ch.ExpiresAt))
	}
	if ch.TTL != 0 {
		l.TTLSeconds = ch.TTL
	}
	if ch.Plan != nil {
		p, err := s.DecodePlan(plan)
		if err != nil {
			return l, false
		}
		l.Plan = p
	}
	if len(ch.URIs) > 0 || len(ch.LostParts) > 0 {
		l.Parts = slices.Clone(l.Parts)
		for i, u := range ch.URIs {
			l.Parts[i].URI = u
		}
		for _, i := range ch.LostParts {
			if i < 0 || i >= len(l.Parts) {
				return l, false
			}
			l.Parts[i].State = api.PartLost
		}
	}
	sqlstore.FillDerived(&l)
	return l, true
}

// TransitionTx is TransitionLease's work inside a transaction, but for
// the event. A refusal (ErrConflict, ErrNotFound) comes before anything is
// written.
//
// When the lease's committed value is known (staged or live), the row is
// updated without being read back, and the change applied to the value.
func (d dialect) TransitionTx(ctx context.Context, tx execer, id string, ch store.LeaseChange, plan string, staged []api.Lease) (api.Lease, error) {
	s := d.s
	prev := s.live.lookup(id, staged)
	var next api.Lease
	var partsText string
	if prev != nil {
		var ok bool
		if next, ok = s.applyChange(*prev, ch, plan); !ok {
			prev = nil
		} else if len(ch.URIs) > 0 || len(ch.LostParts) > 0 {
			partsText = s.PartsJSON(next.Parts)
		}
	}
	// One statement does the compare-and-set, records the parts' URIs and
	// reads the row back.
	set, args := sqlstore.ChangeSet(ch, make([]any, 0, 9+len(ch.From)+2*len(ch.URIs)))
	q := `UPDATE leases SET ` + set
	switch {
	case (len(ch.URIs) > 0 || len(ch.LostParts) > 0) && prev != nil:
		q += `, parts = ?`
		args = append(args, partsText)
	case len(ch.URIs) > 0 || len(ch.LostParts) > 0:
		q += `, parts = json_set(parts` + strings.Repeat(`, ?, ?`, len(ch.URIs)+len(ch.LostParts)) + `)`
		for i, u := range ch.URIs {
			args = append(args, "$["+strconv.Itoa(i)+"].uri", u)
		}
		for _, i := range ch.LostParts {
			args = append(args, "$["+strconv.Itoa(i)+"].state", string(api.PartLost))
		}
	}
	where, args := sqlstore.ChangeWhere(id, ch, args)
	q += where
	var l api.Lease
	var err error
	if prev != nil {
		var res sql.Result
		var n int64
		if res, err = tx.ExecContext(ctx, q, args...); err == nil {
			if n, err = res.RowsAffected(); err == nil && n == 0 {
				err = sql.ErrNoRows
			}
		}
		l = next
	} else {
		l, err = s.ScanLease(tx.QueryRowContext(ctx, q+` RETURNING `+sqlstore.LeaseCols, args...))
	}
	if errors.Is(err, sql.ErrNoRows) {
		return api.Lease{}, s.TransitionRefusal(ctx, tx, id, ch)
	}
	if err != nil {
		return api.Lease{}, sqlstore.Late{Err: fmt.Errorf("sqlite: transition: %w", err)}
	}
	if ch.Plan != nil {
		if err := s.ReplacePlan(ctx, tx, id, plan); err != nil {
			return api.Lease{}, sqlstore.Late{Err: err}
		}
		if prev == nil { // read back before the plan was written
			p, err := s.DecodePlan(plan)
			if err != nil {
				return api.Lease{}, sqlstore.Late{Err: err}
			}
			l.Plan = p
		}
	}
	if ch.To.Terminal() {
		// free only touches live parts: a no-op if the lease had already
		// ended.
		if err := s.Free(ctx, tx, id, false); err != nil {
			return api.Lease{}, sqlstore.Late{Err: err}
		}
	} else if len(ch.LostParts) > 0 {
		if err := s.FreeParts(ctx, tx, id, ch.LostParts); err != nil {
			return api.Lease{}, sqlstore.Late{Err: err}
		}
	}
	return l, nil
}
