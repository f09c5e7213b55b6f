package postgres

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

var _ store.Mover = (*Store)(nil)

// Moves between replicas are serialized like the other lease writes
// (doc.go): BeginMove locks the destination's device (FOR UPDATE, as a
// creation does) before it re-checks the range, then the lease's row;
// FinishMove and EndMove lock the lease's row before they read the move
// again, so that a move ends once and a lease that ends meanwhile is seen.

// SetNodeCordon marks a node cordoned or not.
func (s *Store) SetNodeCordon(ctx context.Context, id string, cordoned bool, ev api.Event) (api.Node, error) {
	var out api.Node
	c := 0
	if cordoned {
		c = 1
	}
	err := s.tx(ctx, func(tx execer) error {
		n, err := scanNode(tx.QueryRowContext(ctx, `UPDATE nodes SET cordoned = ? WHERE id = ? RETURNING `+nodeReadCols, c, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return wrap("cordon", err)
		}
		out = n.Node
		ev.Subject = id
		_, err = appendEvent(ctx, tx, ev)
		return err
	})
	return out, err
}

// shadowIdx is the lease_parts index of the destination of part i while
// it moves.
func shadowIdx(part int) int { return -1 - part }

// lockLease locks a lease's row and reads it.
func (s *Store) lockLease(ctx context.Context, tx execer, id string) (api.Lease, error) {
	var one int
	if err := tx.QueryRowContext(ctx, `SELECT 1 FROM leases WHERE id = ? FOR UPDATE`, id).Scan(&one); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return api.Lease{}, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
		}
		return api.Lease{}, wrap("lock lease", err)
	}
	return s.getLease(ctx, tx, id)
}

// BeginMove records an open move and reserves its destination.
func (s *Store) BeginMove(ctx context.Context, m api.Move, ev api.Event) error {
	to := api.Part{NodeID: m.To.NodeID, DeviceID: m.To.DeviceID, Offset: m.To.Offset, Length: m.To.Length}
	return s.tx(ctx, func(tx execer) error {
		if err := lockParts(ctx, tx, nil, []api.Part{to}); err != nil {
			return err
		}
		l, err := s.lockLease(ctx, tx, m.LeaseID)
		if err != nil {
			return err
		}
		if l.State != api.LeaseActive {
			return fmt.Errorf("lease %s is %s, not active: %w", l.ID, l.State, store.ErrConflict)
		}
		if m.Part < 0 || m.Part >= len(l.Parts) {
			return fmt.Errorf("lease %s has no part %d: %w", l.ID, m.Part, store.ErrConflict)
		}
		p := l.Parts[m.Part]
		if p.NodeID != m.From.NodeID || p.DeviceID != m.From.DeviceID || p.Offset != m.From.Offset || p.Length != m.From.Length {
			return fmt.Errorf("lease %s part %d is no longer where the move starts from: %w", l.ID, m.Part, store.ErrConflict)
		}
		var open int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM lease_moves WHERE lease_id = ? AND part = ? AND state NOT IN ('done', 'failed')`,
			m.LeaseID, m.Part).Scan(&open); err != nil {
			return wrap("begin move", err)
		}
		if open > 0 {
			return fmt.Errorf("lease %s part %d is already moving: %w", l.ID, m.Part, store.ErrConflict)
		}
		if err := checkParts(ctx, tx, l.Kind, []api.Part{to}); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `WITH p AS (INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live)
				VALUES (?, ?, ?, ?, ?, ?, '', 1))
			INSERT INTO lease_moves (id, lease_id, part, kind, state, from_part, to_part, size, reason, started_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			m.LeaseID, shadowIdx(m.Part), to.NodeID, to.DeviceID, to.Offset, to.Length,
			m.ID, m.LeaseID, m.Part, m.Kind, m.State, js(m.From), js(to), m.Size, m.Reason, ns(m.StartedAt), ns(m.StartedAt)); err != nil {
			return wrap("begin move", err)
		}
		ev.Subject = m.LeaseID
		_, err = appendEvent(ctx, tx, ev)
		return err
	})
}

// lockedMove reads move id, then locks its lease and reads the move again
// under the lock.
func (s *Store) lockedMove(ctx context.Context, tx execer, id string) (store.MoveRecord, api.Lease, error) {
	m, err := getMove(ctx, tx, id)
	if err != nil {
		return m, api.Lease{}, err
	}
	l, err := s.lockLease(ctx, tx, m.LeaseID)
	if err != nil {
		return m, l, err
	}
	m, err = getMove(ctx, tx, id)
	return m, l, err
}

// FinishMove makes an open move's destination its lease's part.
func (s *Store) FinishMove(ctx context.Context, id, uri string, at time.Time, ev api.Event) (api.Lease, error) {
	var out api.Lease
	err := s.tx(ctx, func(tx execer) error {
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
		parts := append([]api.Part(nil), l.Parts...)
		parts[m.Part] = api.Part{NodeID: m.To.NodeID, DeviceID: m.To.DeviceID, Offset: m.To.Offset, Length: m.To.Length, URI: uri}
		set := `parts = ?, updated_at = ?`
		args := []any{s.partsJSON(parts), ns(at)}
		if len(parts) == 1 {
			set += `, uri = ?`
			args = append(args, uri)
		}
		// The source's row goes before the destination's takes its index
		// (the key (lease_id, idx) is checked row by row).
		if _, err := tx.ExecContext(ctx, `DELETE FROM lease_parts WHERE lease_id = ? AND idx = ?`, m.LeaseID, m.Part); err != nil {
			return wrap("finish move", err)
		}
		args = append(args, m.LeaseID, m.Part, uri, m.LeaseID, shadowIdx(m.Part), ns(at), id)
		if _, err := tx.ExecContext(ctx, `WITH l AS (UPDATE leases SET `+set+` WHERE id = ?),
			p AS (UPDATE lease_parts SET idx = ?, uri = ? WHERE lease_id = ? AND idx = ?)
			UPDATE lease_moves SET committed = 1, updated_at = ? WHERE id = ?`, args...); err != nil {
			return wrap("finish move", err)
		}
		ev.Subject = m.LeaseID
		if _, err := appendEvent(ctx, tx, ev); err != nil {
			return err
		}
		out, err = s.getLease(ctx, tx, m.LeaseID)
		return err
	})
	return copyLease(out), err
}

// EndMove records a move's end.
func (s *Store) EndMove(ctx context.Context, id, state, errMsg string, copied int64, at time.Time, ev *api.Event) error {
	if state != api.MoveDone && state != api.MoveFailed {
		return fmt.Errorf("postgres: end move: state %q is not an end", state)
	}
	return s.tx(ctx, func(tx execer) error {
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
				return wrap("end move", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE lease_moves SET state = ?, error = ?, copied = ?, updated_at = ? WHERE id = ?`,
			state, errMsg, copied, ns(at), id); err != nil {
			return wrap("end move", err)
		}
		if ev != nil {
			e := *ev
			e.Subject = m.LeaseID
			if _, err := appendEvent(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
}

// SetMoveState records an open move's state and progress.
func (s *Store) SetMoveState(ctx context.Context, id, state string, copied int64, at time.Time) error {
	return s.tx(ctx, func(tx execer) error {
		res, err := tx.ExecContext(ctx, `UPDATE lease_moves SET state = ?, copied = ?, updated_at = ? WHERE id = ? AND state NOT IN ('done', 'failed')`,
			state, copied, ns(at), id)
		if err != nil {
			return wrap("move state", err)
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

func getMove(ctx context.Context, q execer, id string) (store.MoveRecord, error) {
	m, err := scanMove(q.QueryRowContext(ctx, `SELECT `+moveCols+` FROM lease_moves WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return m, fmt.Errorf("move %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return m, wrap("move", err)
	}
	return m, nil
}

// Moves lists moves, oldest first.
func (s *Store) Moves(ctx context.Context, f store.MoveFilter) ([]store.MoveRecord, error) {
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
		return nil, wrap("moves", err)
	}
	defer rows.Close()
	out := []store.MoveRecord{}
	for rows.Next() {
		m, err := scanMove(rows)
		if err != nil {
			return nil, wrap("moves", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("moves", err)
	}
	return out, nil
}
