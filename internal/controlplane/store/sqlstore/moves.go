package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// Moves between replicas are serialized like the other lease writes
// (store/postgres's doc.go): BeginMove locks the destination's device
// (Dialect.LockParts, as a creation does) before it re-checks the range,
// then the lease's row (Dialect.ForUpdate);
// FinishMove and EndMove lock the lease's row before they read the move
// again, so that a move ends once and a lease that ends meanwhile is seen.

// SetNodeCordon marks a node cordoned or not.
func (s *Core) SetNodeCordon(ctx context.Context, id string, cordoned bool, ev api.Event) (api.Node, error) {
	var out api.Node
	c := 0
	if cordoned {
		c = 1
	}
	err := s.tx(ctx, func(tx Execer) error {
		n, err := scanNode(tx.QueryRowContext(ctx, `UPDATE nodes SET cordoned = ? WHERE id = ? RETURNING `+nodeReadCols, c, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return s.wrap("cordon", err)
		}
		out = n.Node
		ev.Subject = id
		_, err = s.AppendEventTx(ctx, tx, ev)
		return err
	})
	return out, err
}

// shadowIdx is the lease_parts index of the destination of part i while
// it moves.
func shadowIdx(part int) int { return -1 - part }

// lockLease locks a lease's row, where the dialect locks rows, and reads
// it.
func (s *Core) lockLease(ctx context.Context, tx Execer, id string) (api.Lease, error) {
	if lock := s.d.ForUpdate(); lock != "" {
		var one int
		if err := tx.QueryRowContext(ctx, `SELECT 1 FROM leases WHERE id = ?`+lock, id).Scan(&one); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return api.Lease{}, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
			}
			return api.Lease{}, s.wrap("lock lease", err)
		}
	}
	return s.GetLease(ctx, tx, id)
}

// lockActivePart takes the locks a move or an adoption of part m.Part of
// lease m.LeaseID onto to takes: to's device (Dialect.LockParts, as a
// creation does), then the lease's row. It returns the lease, refused
// (store.ErrConflict) unless it is active, and its part m.Part, refused
// unless the lease has it.
func (s *Core) lockActivePart(ctx context.Context, tx Execer, m api.Move, to api.Part) (api.Lease, api.Part, error) {
	if err := s.d.LockParts(ctx, tx, nil, []api.Part{to}); err != nil {
		return api.Lease{}, api.Part{}, err
	}
	l, err := s.lockLease(ctx, tx, m.LeaseID)
	if err != nil {
		return l, api.Part{}, err
	}
	if l.State != api.LeaseActive {
		return l, api.Part{}, fmt.Errorf("lease %s is %s, not active: %w", l.ID, l.State, store.ErrConflict)
	}
	if m.Part < 0 || m.Part >= len(l.Parts) {
		return l, api.Part{}, fmt.Errorf("lease %s has no part %d: %w", l.ID, m.Part, store.ErrConflict)
	}
	return l, l.Parts[m.Part], nil
}

// samePlace reports whether parts p and q are the same range of the same
// device of the same node (their URIs and states aside).
func samePlace(p, q api.Part) bool {
	return p.NodeID == q.NodeID && p.DeviceID == q.DeviceID && p.Offset == q.Offset && p.Length == q.Length
}

// notMoving refuses (store.ErrConflict, the lease's part and then what
// in its message) part m.Part of lease m.LeaseID while a move of it is
// open; op names the write in the error of the read.
func (s *Core) notMoving(ctx context.Context, tx Execer, m api.Move, op, what string) error {
	var open int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM lease_moves WHERE lease_id = ? AND part = ? AND state NOT IN ('done', 'failed')`,
		m.LeaseID, m.Part).Scan(&open); err != nil {
		return s.wrap(op, err)
	}
	if open > 0 {
		return fmt.Errorf("lease %s part %d %s: %w", m.LeaseID, m.Part, what, store.ErrConflict)
	}
	return nil
}

// setPart points lease l's row at to, with uri, as its part i (and at uri
// as the lease's URI where i is its only part), updated at at.
func (s *Core) setPart(ctx context.Context, tx Execer, l api.Lease, i int, to api.Part, uri string, at time.Time) error {
	parts := append([]api.Part(nil), l.Parts...)
	parts[i] = api.Part{NodeID: to.NodeID, DeviceID: to.DeviceID, Offset: to.Offset, Length: to.Length, URI: uri}
	set := `parts = ?, updated_at = ?`
	args := []any{s.PartsJSON(parts), ns(at)}
	if len(parts) == 1 {
		set += `, uri = ?`
		args = append(args, uri)
	}
	_, err := tx.ExecContext(ctx, `UPDATE leases SET `+set+` WHERE id = ?`, append(args, l.ID)...)
	return err
}

// BeginMove records an open move and reserves its destination.
func (s *Core) BeginMove(ctx context.Context, m api.Move, ev api.Event) error {
	to := api.Part{NodeID: m.To.NodeID, DeviceID: m.To.DeviceID, Offset: m.To.Offset, Length: m.To.Length}
	return s.tx(ctx, func(tx Execer) error {
		l, p, err := s.lockActivePart(ctx, tx, m, to)
		if err != nil {
			return err
		}
		if !samePlace(p, m.From) {
			return fmt.Errorf("lease %s part %d is no longer where the move starts from: %w", l.ID, m.Part, store.ErrConflict)
		}
		if err := s.notMoving(ctx, tx, m, "begin move", "is already moving"); err != nil {
			return err
		}
		if err := s.checkParts(ctx, tx, l.Kind, []api.Part{to}); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live) VALUES (?, ?, ?, ?, ?, ?, '', 1)`,
			m.LeaseID, shadowIdx(m.Part), to.NodeID, to.DeviceID, to.Offset, to.Length); err != nil {
			return s.wrap("begin move", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_moves (id, lease_id, part, kind, state, from_part, to_part, size, reason, started_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, m.ID, m.LeaseID, m.Part, m.Kind, m.State, js(m.From), js(to), m.Size, m.Reason,
			ns(m.StartedAt), ns(m.StartedAt)); err != nil {
			return s.wrap("begin move", err)
		}
		ev.Subject = m.LeaseID
		_, err = s.AppendEventTx(ctx, tx, ev)
		return err
	})
}

// lockedMove reads move id, then locks its lease and reads the move again
// under the lock.
func (s *Core) lockedMove(ctx context.Context, tx Execer, id string) (store.MoveRecord, api.Lease, error) {
	m, err := s.getMove(ctx, tx, id)
	if err != nil {
		return m, api.Lease{}, err
	}
	l, err := s.lockLease(ctx, tx, m.LeaseID)
	if err != nil {
		return m, l, err
	}
	m, err = s.getMove(ctx, tx, id)
	return m, l, err
}

// FinishMove makes an open move's destination its lease's part.
func (s *Core) FinishMove(ctx context.Context, id, uri string, at time.Time, ev api.Event) (api.Lease, error) {
	var out api.Lease
	err := s.tx(ctx, func(tx Execer) error {
		m, l, err := s.lockedMove(ctx, tx, id)
		if err != nil {
			return err
		}
		if m.Done() || m.Committed {
			return fmt.Errorf("move %s is %s: %w", id, m.State, store.ErrConflict)
		}
		if l.State != api.LeaseActive {
			return fmt.Errorf("lease %s is %s, not active: %w", l.ID, l.State, store.ErrConflict)
		}
		if m.Part >= len(l.Parts) {
			return fmt.Errorf("lease %s has no part %d: %w", l.ID, m.Part, store.ErrConflict)
		}
		// A destination on a node removed or down since the move began
		// does not become the part: the lease would be lost with it
		// (the sweep loses a down or removed node's leases), while its
		// source still holds the part.
		var nstate string
		if err := tx.QueryRowContext(ctx, `SELECT state FROM nodes WHERE id = ?`, m.To.NodeID).Scan(&nstate); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return s.wrap("finish move", err)
		}
		if st := api.NodeState(nstate); st == api.NodeRemoved || st == api.NodeDown || st == "" {
			if st == "" {
				st = "unknown"
			}
			return fmt.Errorf("the destination node %s is %s: %w", m.To.NodeID, st, store.ErrConflict)
		}
		// The source's row goes before the destination's takes its index
		// (the key (lease_id, idx) is checked row by row).
		if _, err := tx.ExecContext(ctx, `DELETE FROM lease_parts WHERE lease_id = ? AND idx = ?`, m.LeaseID, m.Part); err != nil {
			return s.wrap("finish move", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE lease_parts SET idx = ?, uri = ? WHERE lease_id = ? AND idx = ?`,
			m.Part, uri, m.LeaseID, shadowIdx(m.Part)); err != nil {
			return s.wrap("finish move", err)
		}
		if err := s.setPart(ctx, tx, l, m.Part, m.To, uri, at); err != nil {
			return s.wrap("finish move", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE lease_moves SET committed = 1, updated_at = ? WHERE id = ?`, ns(at), id); err != nil {
			return s.wrap("finish move", err)
		}
		ev.Subject = m.LeaseID
		if _, err := s.AppendEventTx(ctx, tx, ev); err != nil {
			return err
		}
		out, err = s.GetLease(ctx, tx, m.LeaseID)
		return err
	})
	return CopyLease(out), err
}

// AdoptPart makes what a lender holds of an active lease its part at once
// (store.Mover.AdoptPart): the destination is checked as a move's, on a
// cordoned node too, under the same locks; the part's row is replaced,
// the source range freed with it, and the move recorded done.
func (s *Core) AdoptPart(ctx context.Context, m api.Move, uri string, ev api.Event) (api.Lease, error) {
	to := api.Part{NodeID: m.To.NodeID, DeviceID: m.To.DeviceID, Offset: m.To.Offset, Length: m.To.Length}
	var out api.Lease
	err := s.tx(ctx, func(tx Execer) error {
		l, p, err := s.lockActivePart(ctx, tx, m, to)
		if err != nil {
			return err
		}
		if p.Lost() || !samePlace(p, m.From) {
			return fmt.Errorf("lease %s part %d is no longer at %s %s [%d+%d]: %w", l.ID, m.Part, m.From.NodeID, m.From.DeviceID, m.From.Offset, m.From.Length, store.ErrConflict)
		}
		if to.Length != p.Length {
			return fmt.Errorf("lease %s part %d is %d long, not %d: %w", l.ID, m.Part, p.Length, to.Length, store.ErrConflict)
		}
		if err := s.notMoving(ctx, tx, m, "adopt part", "is moving"); err != nil {
			return err
		}
		// The part's own row does not count against its new range (a
		// part adopted on its device, next to where it was recorded).
		if _, err := tx.ExecContext(ctx, `DELETE FROM lease_parts WHERE lease_id = ? AND idx = ?`, m.LeaseID, m.Part); err != nil {
			return s.wrap("adopt part", err)
		}
		var r PartRow
		err = tx.QueryRowContext(ctx, PartCheckSQL, PartCheckArgs(to)...).Scan(&r.DState, &r.DKind, &r.Capacity, &r.NodeID, &r.NState, &r.Cordoned, &r.Taken)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("device %s: %w", to.DeviceID, store.ErrCapacity)
		}
		if err != nil {
			return s.wrap("adopt part", err)
		}
		r.Cordoned = false // no new part: the bytes are there already
		if err := JudgePart(l.Kind, []api.Part{to}, 0, r); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live) VALUES (?, ?, ?, ?, ?, ?, ?, 1)`,
			m.LeaseID, m.Part, to.NodeID, to.DeviceID, to.Offset, to.Length, uri); err != nil {
			return s.wrap("adopt part", err)
		}
		if err := s.setPart(ctx, tx, l, m.Part, to, uri, ev.At); err != nil {
			return s.wrap("adopt part", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO lease_moves (id, lease_id, part, kind, state, from_part, to_part, size, reason, committed, started_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)`, m.ID, m.LeaseID, m.Part, m.Kind, api.MoveDone, js(m.From), js(to), m.Size, m.Reason,
			ns(ev.At), ns(ev.At)); err != nil {
			return s.wrap("adopt part", err)
		}
		ev.Subject = m.LeaseID
		if _, err := s.AppendEventTx(ctx, tx, ev); err != nil {
			return err
		}
		out, err = s.GetLease(ctx, tx, m.LeaseID)
		return err
	})
	return CopyLease(out), err
}

// EndMove records a move's end.
func (s *Core) EndMove(ctx context.Context, id, state, errMsg string, copied int64, at time.Time, ev *api.Event) error {
	if state != api.MoveDone && state != api.MoveFailed {
		return fmt.Errorf("end move: state %q is not an end", state)
	}
	return s.tx(ctx, func(tx Execer) error {
		m, _, err := s.lockedMove(ctx, tx, id)
		if err != nil {
			return err
		}
		if m.Done() {
			return nil
		}
		if !m.Committed {
			// The destination never became the part: free it.
			if _, err := tx.ExecContext(ctx, `DELETE FROM lease_parts WHERE lease_id = ? AND idx = ?`, m.LeaseID, shadowIdx(m.Part)); err != nil {
				return s.wrap("end move", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE lease_moves SET state = ?, error = ?, copied = ?, updated_at = ? WHERE id = ?`,
			state, errMsg, copied, ns(at), id); err != nil {
			return s.wrap("end move", err)
		}
		if ev != nil {
			e := *ev
			e.Subject = m.LeaseID
			if _, err := s.AppendEventTx(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
}

// SetMoveState records an open move's state and progress.
func (s *Core) SetMoveState(ctx context.Context, id, state string, copied int64, at time.Time) error {
	return s.tx(ctx, func(tx Execer) error {
		res, err := tx.ExecContext(ctx, `UPDATE lease_moves SET state = ?, copied = ?, updated_at = ? WHERE id = ? AND state NOT IN ('done', 'failed')`,
			state, copied, ns(at), id)
		if err != nil {
			return s.wrap("move state", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("move %s: %w", id, store.ErrConflict)
		}
		return nil
	})
}

const moveCols = `id, lease_id, part, kind, state, from_part, to_part, size, copied, reason, error, committed, started_at, updated_at`

func scanMove(sc interface{ Scan(...any) error }) (store.MoveRecord, error) {
	var m store.MoveRecord
	var from, to string
	var started, updated int64
	var committed int
	if err := sc.Scan(&m.ID, &m.LeaseID, &m.Part, &m.Kind, &m.State, &from, &to, &m.Size, &m.Copied, &m.Reason, &m.Error,
		&committed, &started, &updated); err != nil {
		return m, err
	}
	m.Committed = committed != 0
	m.StartedAt, m.UpdatedAt = tm(started), tm(updated)
	return m, errors.Join(unjs(from, &m.From), unjs(to, &m.To))
}

func (s *Core) getMove(ctx context.Context, q Execer, id string) (store.MoveRecord, error) {
	m, err := scanMove(q.QueryRowContext(ctx, `SELECT `+moveCols+` FROM lease_moves WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return m, fmt.Errorf("move %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return m, s.wrap("move", err)
	}
	return m, nil
}

// Moves lists moves, oldest first.
func (s *Core) Moves(ctx context.Context, f store.MoveFilter) ([]store.MoveRecord, error) {
	var where []string
	var args []any
	if f.LeaseID != "" {
		where = append(where, `lease_id = ?`)
		args = append(args, f.LeaseID)
	}
	if f.Open {
		where = append(where, `state NOT IN ('done', 'failed')`)
	}
	if !f.Since.IsZero() {
		where = append(where, `updated_at >= ?`)
		args = append(args, ns(f.Since))
	}
	cond := ""
	if len(where) > 0 {
		cond = ` WHERE ` + strings.Join(where, ` AND `)
	}
	rows, err := s.rd().QueryContext(ctx, `SELECT `+moveCols+` FROM lease_moves`+cond+` ORDER BY started_at, id`, args...)
	if err != nil {
		return nil, s.wrap("moves", err)
	}
	defer rows.Close()
	out := []store.MoveRecord{}
	for rows.Next() {
		m, err := scanMove(rows)
		if err != nil {
			return nil, s.wrap("moves", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("moves", err)
	}
	return out, nil
}
