package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func tm(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic("sqlite: encode: " + err.Error()) // only maps of strings and api types
	}
	return string(b)
}

func unjs(s string, v any) error {
	if s == "" || s == "null" {
		return nil
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return fmt.Errorf("sqlite: decode stored JSON: %w", err)
	}
	return nil
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// appendEvents appends events with as few statements as it can: rows are
// inserted in chunks of a power of two (at most maxEventRows), so that a
// handful of prepared statements serve every batch size.
func appendEvents(ctx context.Context, q execer, evs []api.Event) error {
	const maxEventRows = 64
	var args []any
	for len(evs) > 0 {
		n := maxEventRows
		for n > len(evs) {
			n /= 2
		}
		args = args[:0]
		for _, ev := range evs[:n] {
			if ev.At.IsZero() {
				ev.At = time.Now().UTC()
			}
			args = append(args, ns(ev.At), ev.Type, ev.Subject, ev.Message, ev.State)
		}
		if _, err := q.ExecContext(ctx, eventInsert(n), args...); err != nil {
			return fmt.Errorf("sqlite: append events: %w", err)
		}
		evs = evs[n:]
	}
	return nil
}

var eventInserts sync.Map // rows → statement text

func eventInsert(n int) string {
	if v, ok := eventInserts.Load(n); ok {
		return v.(string)
	}
	q := `INSERT INTO events (at, type, subject, message, state) VALUES (?, ?, ?, ?, ?)` + strings.Repeat(`, (?, ?, ?, ?, ?)`, n-1)
	eventInserts.Store(n, q)
	return q
}

func appendEvent(ctx context.Context, q execer, ev api.Event) (api.Event, error) {
	if ev.Type == "" {
		return ev, nil
	}
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	res, err := q.ExecContext(ctx, `INSERT INTO events (at, type, subject, message, state) VALUES (?, ?, ?, ?, ?)`,
		ns(ev.At), ev.Type, ev.Subject, ev.Message, ev.State)
	if err != nil {
		return ev, fmt.Errorf("sqlite: append event: %w", err)
	}
	ev.ID, _ = res.LastInsertId()
	return ev, nil
}

// AppendEvent appends one event.
func (s *Store) AppendEvent(ctx context.Context, ev api.Event) (api.Event, error) {
	var out api.Event
	err := s.tx(ctx, func(tx execer) error {
		var err error
		out, err = appendEvent(ctx, tx, ev)
		return err
	})
	return out, err
}

// Events returns events with ID > since.
func (s *Store) Events(ctx context.Context, since int64, limit int, tenant string) ([]api.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	q, args := `SELECT id, at, type, subject, message, state FROM events WHERE id > ?`, []any{since}
	if tenant != "" {
		q += ` AND (type NOT LIKE 'lease.%' OR EXISTS (SELECT 1 FROM leases WHERE leases.id = events.subject AND leases.tenant = ?))`
		args = append(args, tenant)
	}
	rows, err := s.rd().QueryContext(ctx, q+` ORDER BY id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: events: %w", err)
	}
	defer rows.Close()
	out := []api.Event{}
	for rows.Next() {
		var e api.Event
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Type, &e.Subject, &e.Message, &e.State); err != nil {
			return nil, fmt.Errorf("sqlite: events: %w", err)
		}
		e.At = tm(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// PutToken stores or replaces a token.
func (s *Store) PutToken(ctx context.Context, t store.Token) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now()
	}
	return s.tx(ctx, func(tx execer) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tokens (hash, kind, tenant, admin, created_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (hash) DO UPDATE SET kind = excluded.kind, tenant = excluded.tenant, admin = excluded.admin`,
			t.Hash, t.Kind, t.Tenant, t.Admin, ns(t.CreatedAt))
		if err != nil {
			return fmt.Errorf("sqlite: put token: %w", err)
		}
		return nil
	})
}

// LookupToken finds a token by hash.
func (s *Store) LookupToken(ctx context.Context, hash string) (store.Token, error) {
	var t store.Token
	var created int64
	err := s.rd().QueryRowContext(ctx, `SELECT hash, kind, tenant, admin, created_at FROM tokens WHERE hash = ?`, hash).
		Scan(&t.Hash, &t.Kind, &t.Tenant, &t.Admin, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("token: %w", store.ErrNotFound)
	}
	if err != nil {
		return t, fmt.Errorf("sqlite: token: %w", err)
	}
	t.CreatedAt = tm(created)
	return t, nil
}

const nodeCols = `id, machine_id, name, state, address, agent_url, endpoints, labels, fingerprint, health, last_heartbeat, joined_at, agent_key`

func scanNode(sc interface{ Scan(...any) error }) (store.NodeRecord, error) {
	var n store.NodeRecord
	var machine, endpoints, labels, fp string
	var hb, joined int64
	if err := sc.Scan(&n.ID, &machine, &n.Name, &n.State, &n.Address, &n.AgentURL, &endpoints, &labels, &fp, &n.Health, &hb, &joined, &n.AgentKey); err != nil {
		return n, err
	}
	n.LastHeartbeat, n.JoinedAt = tm(hb), tm(joined)
	if err := errors.Join(unjs(endpoints, &n.Endpoints), unjs(labels, &n.Labels), unjs(fp, &n.Fingerprint)); err != nil {
		return n, err
	}
	return n, nil
}

// JoinNode registers or re-registers a node by machine ID.
func (s *Store) JoinNode(ctx context.Context, j store.JoinNode, ev api.Event) (api.Node, bool, error) {
	var out api.Node
	var rejoined bool
	err := s.tx(ctx, func(tx execer) error {
		n := j.Node
		var id string
		var joined int64
		err := tx.QueryRowContext(ctx, `SELECT id, joined_at FROM nodes WHERE machine_id = ?`, n.Fingerprint.MachineID).Scan(&id, &joined)
		switch {
		case err == nil:
			rejoined = true
			n.ID = id
			n.JoinedAt = tm(joined)
			_, err = tx.ExecContext(ctx, `UPDATE nodes SET name = ?, state = ?, address = ?, agent_url = ?, endpoints = ?, labels = ?,
				fingerprint = ?, health = ?, credential_hash = ?, agent_key = ?, last_heartbeat = ? WHERE id = ?`,
				n.Name, n.State, n.Address, n.AgentURL, js(n.Endpoints), js(n.Labels), js(n.Fingerprint), n.Health,
				j.CredentialHash, j.AgentKey, ns(n.LastHeartbeat), id)
		case errors.Is(err, sql.ErrNoRows):
			_, err = tx.ExecContext(ctx, `INSERT INTO nodes (`+nodeCols+`, credential_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				n.ID, n.Fingerprint.MachineID, n.Name, n.State, n.Address, n.AgentURL, js(n.Endpoints), js(n.Labels), js(n.Fingerprint),
				n.Health, ns(n.LastHeartbeat), ns(n.JoinedAt), j.AgentKey, j.CredentialHash)
		}
		if err != nil {
			return fmt.Errorf("sqlite: join node: %w", err)
		}
		// Devices: upsert by (node, name); unreported ones become unavailable.
		seen := map[string]bool{}
		for _, d := range j.Devices {
			seen[d.Name] = true
			var did string
			var allocated int64
			err := tx.QueryRowContext(ctx, `SELECT id, `+allocatedExpr+` FROM devices d WHERE node_id = ? AND name = ?`, n.ID, d.Name).Scan(&did, &allocated)
			switch {
			case err == nil:
				capacity := d.Capacity
				if capacity < allocated {
					capacity = allocated // never below what live leases hold
				}
				_, err = tx.ExecContext(ctx, `UPDATE devices SET kind = ?, state = 'available', capacity = ?, model = ?, attributes = ?, sharing = ? WHERE id = ?`,
					d.Kind, capacity, d.Model, js(d.Attributes), d.Sharing, did)
			case errors.Is(err, sql.ErrNoRows):
				_, err = tx.ExecContext(ctx, `INSERT INTO devices (id, node_id, name, kind, state, capacity, model, attributes, sharing) VALUES (?, ?, ?, ?, 'available', ?, ?, ?, ?)`,
					resource.NewID("dev"), n.ID, d.Name, d.Kind, d.Capacity, d.Model, js(d.Attributes), d.Sharing)
			}
			if err != nil {
				return fmt.Errorf("sqlite: register device %s: %w", d.Name, err)
			}
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, name FROM devices WHERE node_id = ?`, n.ID)
		if err != nil {
			return fmt.Errorf("sqlite: join node: %w", err)
		}
		var gone []string
		for rows.Next() {
			var did, name string
			if err := rows.Scan(&did, &name); err != nil {
				rows.Close()
				return fmt.Errorf("sqlite: join node: %w", err)
			}
			if !seen[name] {
				gone = append(gone, did)
			}
		}
		rows.Close()
		for _, did := range gone {
			if _, err := tx.ExecContext(ctx, `UPDATE devices SET state = 'unavailable' WHERE id = ?`, did); err != nil {
				return fmt.Errorf("sqlite: join node: %w", err)
			}
		}
		ev.Subject = n.ID
		if _, err := appendEvent(ctx, tx, ev); err != nil {
			return err
		}
		out = n
		return nil
	})
	return out, rejoined, err
}

// NodeByCredential finds a node by its credential hash.
func (s *Store) NodeByCredential(ctx context.Context, credHash string) (api.Node, error) {
	n, err := scanNode(s.rd().QueryRowContext(ctx, `SELECT `+nodeCols+` FROM nodes WHERE credential_hash = ?`, credHash))
	if errors.Is(err, sql.ErrNoRows) {
		return api.Node{}, fmt.Errorf("node credential: %w", store.ErrNotFound)
	}
	if err != nil {
		return api.Node{}, fmt.Errorf("sqlite: node by credential: %w", err)
	}
	return n.Node, nil
}

// Heartbeat records a heartbeat.
func (s *Store) Heartbeat(ctx context.Context, nodeID string, at time.Time, health string, links []api.Link) (api.NodeState, error) {
	prev, errs, err := s.Heartbeats(ctx, []store.Beat{{NodeID: nodeID, At: at, Health: health, Links: links}})
	if err != nil {
		return "", err
	}
	return prev[0], errs[0]
}

// Heartbeats records many heartbeats in one transaction.
func (s *Store) Heartbeats(ctx context.Context, beats []store.Beat) ([]api.NodeState, []error, error) {
	prev := make([]api.NodeState, len(beats))
	errs := make([]error, len(beats))
	err := s.tx(ctx, func(tx execer) error {
		for i, b := range beats {
			// The usual case, a ready node, is one statement; a node that
			// was not ready (or is unknown) is read first.
			res, err := tx.ExecContext(ctx, `UPDATE nodes SET health = ?, last_heartbeat = ? WHERE id = ? AND state = 'ready'`, b.Health, ns(b.At), b.NodeID)
			var n int64
			if err == nil {
				n, err = res.RowsAffected()
			}
			if err != nil {
				return fmt.Errorf("sqlite: heartbeat: %w", err)
			}
			prev[i] = api.NodeReady
			if n == 0 {
				if err := tx.QueryRowContext(ctx, `SELECT state FROM nodes WHERE id = ?`, b.NodeID).Scan(&prev[i]); err != nil {
					if errors.Is(err, sql.ErrNoRows) {
						errs[i] = fmt.Errorf("node %s: %w", b.NodeID, store.ErrNotFound)
						continue
					}
					return fmt.Errorf("sqlite: heartbeat: %w", err)
				}
				if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = 'ready', health = ?, last_heartbeat = ? WHERE id = ?`, b.Health, ns(b.At), b.NodeID); err != nil {
					return fmt.Errorf("sqlite: heartbeat: %w", err)
				}
			}
			for _, l := range b.Links {
				if l.ID == "" {
					l.ID = l.From + ">" + l.To
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO links (id, from_node, to_node, kind, bandwidth_bps, rtt_us, status, load_bps, measured_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (from_node, to_node) DO UPDATE SET kind = excluded.kind, bandwidth_bps = excluded.bandwidth_bps,
				rtt_us = excluded.rtt_us, status = excluded.status, load_bps = excluded.load_bps, measured_at = excluded.measured_at`,
					l.ID, l.From, l.To, l.Kind, l.BandwidthBps, l.RTTMicros, l.Status, l.LoadBps, ns(l.MeasuredAt))
				if err != nil {
					return fmt.Errorf("sqlite: link: %w", err)
				}
			}
			if prev[i] != api.NodeReady {
				if _, err := appendEvent(ctx, tx, api.Event{At: b.At, Type: "node.ready", Subject: b.NodeID, Message: "heartbeat after " + string(prev[i]), State: string(api.NodeReady)}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return prev, errs, err
}

// SetNodeState moves a node between states.
func (s *Store) SetNodeState(ctx context.Context, id string, from, to api.NodeState, ev api.Event) error {
	return s.tx(ctx, func(tx execer) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE id = ? AND state = ?`, to, id, from)
		if err != nil {
			return fmt.Errorf("sqlite: set node state: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("node %s not %s: %w", id, from, store.ErrConflict)
		}
		_, err = appendEvent(ctx, tx, ev)
		return err
	})
}

// Node returns one node with its agent key.
func (s *Store) Node(ctx context.Context, id string) (store.NodeRecord, error) {
	n, err := scanNode(s.rd().QueryRowContext(ctx, `SELECT `+nodeCols+` FROM nodes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return n, fmt.Errorf("node %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return n, fmt.Errorf("sqlite: node: %w", err)
	}
	return n, nil
}

func nodes(ctx context.Context, q execer) ([]api.Node, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+nodeCols+` FROM nodes ORDER BY name, id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: nodes: %w", err)
	}
	defer rows.Close()
	out := []api.Node{}
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite: nodes: %w", err)
		}
		out = append(out, n.Node)
	}
	return out, rows.Err()
}

// Nodes lists nodes.
func (s *Store) Nodes(ctx context.Context) ([]api.Node, error) { return nodes(ctx, s.rd()) }

// allocatedExpr is a device d's allocation: the bytes (or slots) its live
// parts hold. It is computed, not kept in a column, so that reserving and
// freeing write only lease_parts.
const allocatedExpr = `(SELECT COALESCE(SUM(p.length), 0) FROM lease_parts p WHERE p.device_id = d.id AND p.live = 1)`

func devices(ctx context.Context, q execer) ([]api.Device, error) {
	rows, err := q.QueryContext(ctx, `SELECT d.id, d.node_id, d.name, d.kind, d.state, d.capacity, `+allocatedExpr+`, d.model, d.attributes, d.sharing
		FROM devices d JOIN nodes n ON n.id = d.node_id ORDER BY n.name, d.node_id, d.name`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: devices: %w", err)
	}
	defer rows.Close()
	out := []api.Device{}
	for rows.Next() {
		var d api.Device
		var attrs string
		if err := rows.Scan(&d.ID, &d.NodeID, &d.Name, &d.Kind, &d.State, &d.Capacity, &d.Allocated, &d.Model, &attrs, &d.Sharing); err != nil {
			return nil, fmt.Errorf("sqlite: devices: %w", err)
		}
		if err := unjs(attrs, &d.Attributes); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// Devices lists devices.
func (s *Store) Devices(ctx context.Context) ([]api.Device, error) { return devices(ctx, s.rd()) }

func links(ctx context.Context, q execer) ([]api.Link, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, from_node, to_node, kind, bandwidth_bps, rtt_us, status, load_bps, measured_at FROM links ORDER BY from_node, to_node`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: links: %w", err)
	}
	defer rows.Close()
	out := []api.Link{}
	for rows.Next() {
		var l api.Link
		var at int64
		if err := rows.Scan(&l.ID, &l.From, &l.To, &l.Kind, &l.BandwidthBps, &l.RTTMicros, &l.Status, &l.LoadBps, &at); err != nil {
			return nil, fmt.Errorf("sqlite: links: %w", err)
		}
		l.MeasuredAt = tm(at)
		l.State = l.Status
		out = append(out, l)
	}
	return out, rows.Err()
}

// Links lists links.
func (s *Store) Links(ctx context.Context) ([]api.Link, error) { return links(ctx, s.rd()) }

// Inventory reads nodes, devices, live parts and links in one read transaction.
func (s *Store) Inventory(ctx context.Context) (store.Inventory, error) {
	var inv store.Inventory
	rtx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: s.r != s.w})
	if err != nil {
		return inv, fmt.Errorf("sqlite: inventory: %w", err)
	}
	defer s.rs.flush(ctx) // runs after the rollback below
	defer rtx.Rollback()
	tx := cachedTx{rtx, s.rs}
	if inv.Nodes, err = nodes(ctx, tx); err != nil {
		return inv, err
	}
	if inv.Devices, err = devices(ctx, tx); err != nil {
		return inv, err
	}
	if inv.Links, err = links(ctx, tx); err != nil {
		return inv, err
	}
	if inv.Profiles, err = profiles(ctx, tx); err != nil {
		return inv, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT p.lease_id, p.node_id, p.device_id, p.off, p.length, l.mode, l.tenant, l.demand_bps, l.work_bytes, l.deadline_at
		FROM lease_parts p JOIN leases l ON l.id = p.lease_id WHERE p.live = 1 ORDER BY p.lease_id, p.idx`)
	if err != nil {
		return inv, fmt.Errorf("sqlite: inventory: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var p store.LivePart
		var deadline int64
		if err := rows.Scan(&p.LeaseID, &p.NodeID, &p.DeviceID, &p.Offset, &p.Length, &p.Mode, &p.Tenant, &p.Demand.Bandwidth, &p.Demand.Work, &deadline); err != nil {
			return inv, fmt.Errorf("sqlite: inventory: %w", err)
		}
		if deadline != 0 {
			p.Demand.Deadline = tm(deadline)
		}
		inv.Parts = append(inv.Parts, p)
	}
	return inv, rows.Err()
}

// Counts returns nodes and leases by state.
func (s *Store) Counts(ctx context.Context) (store.Counts, error) {
	c := store.Counts{Nodes: map[api.NodeState]int{}, Leases: map[api.LeaseState]int{}}
	for _, q := range []struct {
		sql string
		put func(string, int)
	}{
		{`SELECT state, COUNT(*) FROM nodes GROUP BY state`, func(s string, n int) { c.Nodes[api.NodeState(s)] = n }},
		{`SELECT state, COUNT(*) FROM leases GROUP BY state`, func(s string, n int) { c.Leases[api.LeaseState(s)] = n }},
	} {
		rows, err := s.rd().QueryContext(ctx, q.sql)
		if err != nil {
			return c, fmt.Errorf("sqlite: counts: %w", err)
		}
		for rows.Next() {
			var st string
			var n int
			if err := rows.Scan(&st, &n); err != nil {
				rows.Close()
				return c, fmt.Errorf("sqlite: counts: %w", err)
			}
			q.put(st, n)
		}
		rows.Close()
	}
	return c, nil
}

// PutProfile stores a profile.
func (s *Store) PutProfile(ctx context.Context, p api.Profile, ev api.Event) (api.Profile, error) {
	if p.ID == "" {
		p.ID = p.Model
	}
	if p.State == "" {
		p.State = "ready"
	}
	err := s.tx(ctx, func(tx execer) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO profiles (id, state, data, source, measured_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET state = excluded.state, data = excluded.data, source = excluded.source, measured_at = excluded.measured_at`,
			p.ID, p.State, js(p), p.Source, ns(p.MeasuredAt))
		if err != nil {
			return fmt.Errorf("sqlite: put profile: %w", err)
		}
		_, err = appendEvent(ctx, tx, ev)
		return err
	})
	return p, err
}

// Profiles lists profiles.
func (s *Store) Profiles(ctx context.Context) ([]api.Profile, error) { return profiles(ctx, s.rd()) }

func profiles(ctx context.Context, q execer) ([]api.Profile, error) {
	rows, err := q.QueryContext(ctx, `SELECT data FROM profiles ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: profiles: %w", err)
	}
	defer rows.Close()
	out := []api.Profile{}
	for rows.Next() {
		var data string
		var p api.Profile
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("sqlite: profiles: %w", err)
		}
		if err := unjs(data, &p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
