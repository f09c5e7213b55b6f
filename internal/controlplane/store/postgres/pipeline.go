package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlstore"
)

// A batch of lease writes (LeaseOps) in one round trip, or two: most of
// a PostgreSQL transaction's cost is its round trips, and a batch written
// statement by statement makes one or two per op. Usually the batch is
// one round trip: lock the creations' devices, write every op in order,
// each creation re-checking its parts in its own statement (createSQL,
// checked) and each successful op appending its event under the event
// log's lock, all in PostgreSQL's implicit transaction (no BEGIN or
// COMMIT statement: the pipeline's Sync commits it, or rolls it back
// after an error). A creation refused there (a part another
// replica took, a used idempotency key) fails the whole batch, which is
// rolled back and sent again in two round trips (errRecheck): the first
// begins the transaction, takes the locks (tenants, devices: doc.go) and
// reads what the creations' checks need; the creations are judged here;
// the second writes the accepted ones and the transitions and commits. A
// creation carrying its tenant's limit always takes the two round trips
// (checkable). A transition whose compare-and-set fails writes nothing
// (its event is conditional on its update); the few that fail are told
// apart (not found or conflict) afterwards. Judging the creations before
// the writes is conservative within a batch: a creation is checked
// against the parts the store held before the batch and those of the
// batch's earlier creations, not the parts freed by the batch's earlier
// transitions (the caller places it again); a creation checking itself
// sees both. Anything unexpected (an op failing with an error after
// writing) rolls the batch back, which is then written statement by
// statement with savepoints (leaseOpsSeq). The control plane's group
// commit sends creations and transitions in transactions of their own
// (batch.go).

// errSequential asks for the statement-by-statement path.
var errSequential = errors.New("postgres: batch needs the sequential path")

// pipelined writes ops in one round trip, or two (careful, or when a
// creation needs them: see above).
func (s *Store) pipelined(ctx context.Context, ops []store.LeaseOp, texts []sqlstore.OpText, tenants []string, devs []string, careful bool) (out []api.Lease, errs []error, err error) {
	err = s.onConn(ctx, "connection", func(c *pgx.Conn) error {
		out, errs, err = s.pipeline(ctx, c, ops, texts, tenants, devs, careful)
		return err
	})
	return out, errs, err
}

// onConn runs f on a connection of the pool, as pgx's (batches), and
// rolls back what f left open when it fails; a connection that cannot
// roll back is closed (the pool drops it). Only an error taking the
// connection is wrapped (as what).
func (s *Store) onConn(ctx context.Context, what string, f func(c *pgx.Conn) error) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return wrap(what, err)
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		c := dc.(*stdlib.Conn).Conn()
		err := f(c)
		if err != nil && c.PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, rerr := c.Exec(rctx, "ROLLBACK")
			cancel()
			if rerr != nil {
				c.PgConn().Close(rctx) // the pool drops it (IsClosed)
			}
		}
		return err
	})
}

func (s *Store) pipeline(ctx context.Context, c *pgx.Conn, ops []store.LeaseOp, texts []sqlstore.OpText, tenants []string, devs []string, careful bool) ([]api.Lease, []error, error) {
	out, errs := make([]api.Lease, len(ops)), make([]error, len(ops))
	accepted := make([]bool, len(ops)) // the creations to write

	// Round trip 1, unless the batch holds transitions only (which lock
	// and read nothing first) or creations that check themselves: begin,
	// lock, read for the creations' checks, judge them.
	oneTrip, creates := true, false
	for _, op := range ops {
		if op.Create != nil {
			creates = true
			if careful || !checkable(*op.Create) {
				oneTrip = false
			}
		}
	}
	checked := oneTrip && creates // each creation checks itself (createSQL)
	if checked {
		for i, op := range ops {
			accepted[i] = op.Create != nil
		}
	}
	if !oneTrip {
		if err := s.readForCreations(ctx, c, ops, tenants, devs, errs, accepted); err != nil {
			return nil, nil, err
		}
	}

	// Round trip 2: (lock the creations' devices,) write every op in
	// order, events under the log's lock (shared: writers do not wait for
	// one another), commit. In one round trip the batch is PostgreSQL's
	// implicit transaction: every statement up to the pipeline's Sync runs
	// in one transaction, committed at the Sync (rolled back at the first
	// error), so it needs no BEGIN and no COMMIT statement (two fewer per
	// transaction). After readForCreations it ends the transaction that
	// one began.
	b := &pgx.Batch{}
	lockBoth := oneTrip && len(devs) > 0 // the devices' and the event log's locks in one statement
	if lockBoth {
		b.Queue(lockDevicesSQL(len(devs), true), append(anys(devs), lockClass, lockEvents)...)
	} else {
		b.Queue(`SELECT pg_advisory_xact_lock_shared($1, $2)`, lockClass, lockEvents)
	}
	for i, op := range ops {
		if op.Create != nil {
			if accepted[i] {
				q, args := createSQL(*op.Create, texts[i], checked)
				b.Queue(q, args...)
			}
			continue
		}
		q, args := transitionSQL(op.Transition, texts[i].Plan)
		b.Queue(q, args...)
	}
	if !oneTrip {
		b.Queue("COMMIT")
	}
	br := c.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, nil, wrap("lock", err)
	}
	var missed []int
	for i, op := range ops {
		if op.Create != nil {
			if !accepted[i] {
				continue
			}
			if _, err := br.Exec(); err != nil {
				br.Close()
				if checked {
					return nil, nil, writeError(err, errRecheck)
				}
				return nil, nil, writeError(err, errSequential)
			}
			out[i] = sqlstore.CreatedLease(op.Create.Lease)
			continue
		}
		l, err := s.ScanLease(br.QueryRow())
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			missed = append(missed, i)
		case err != nil:
			br.Close()
			return nil, nil, writeError(err, errSequential)
		default:
			if op.Transition.Change.Plan != nil {
				p, err := s.DecodePlan(texts[i].Plan)
				if err != nil {
					br.Close()
					return nil, nil, err
				}
				l.Plan = p
			}
			out[i] = l
		}
	}
	if !oneTrip {
		if _, err := br.Exec(); err != nil { // COMMIT
			br.Close()
			return nil, nil, wrap("commit", err)
		}
	}
	if err := br.Close(); err != nil { // the Sync: commits an implicit transaction
		return nil, nil, wrap("commit", err)
	}

	// The transitions that found their lease in another state, or none.
	if len(missed) > 0 {
		ids := make([]string, len(missed))
		for k, i := range missed {
			ids[k] = ops[i].Transition.ID
		}
		rows, err := c.Query(ctx, `SELECT id, state, tenant FROM leases WHERE id = ANY($1)`, ids)
		if err != nil {
			return nil, nil, wrap("transition", err)
		}
		found := map[string][2]string{}
		for rows.Next() {
			var id, st, tenant string
			if err := rows.Scan(&id, &st, &tenant); err != nil {
				rows.Close()
				return nil, nil, wrap("transition", err)
			}
			found[id] = [2]string{st, tenant}
		}
		rows.Close()
		for _, i := range missed {
			t := ops[i].Transition
			f, ok := found[t.ID]
			if !ok || t.Change.Tenant != "" && f[1] != t.Change.Tenant {
				errs[i] = fmt.Errorf("lease %s: %w", t.ID, store.ErrNotFound)
			} else if len(t.Change.From) == 0 {
				errs[i] = fmt.Errorf("lease %s: no source state: %w", t.ID, store.ErrConflict)
			} else if !t.Change.ExpiredBy.IsZero() && slices.Contains(t.Change.From, api.LeaseState(f[0])) {
				errs[i] = fmt.Errorf("lease %s was renewed: %w", t.ID, store.ErrConflict)
			} else {
				errs[i] = fmt.Errorf("lease %s is %s, not %v: %w", t.ID, f[0], t.Change.From, store.ErrConflict)
			}
		}
	}
	return out, errs, nil
}

// readForCreations is a batch's first round trip: it begins the
// transaction, takes the locks (tenants, devices: doc.go) and reads what
// the creations' checks need, then judges the creations: it sets
// accepted[i] for a creation to write, errs[i] for one refused.
func (s *Store) readForCreations(ctx context.Context, c *pgx.Conn, ops []store.LeaseOp, tenants, devs []string, errs []error, accepted []bool) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	for _, t := range tenants {
		b.Queue(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, lockTenantNS, t)
	}
	if len(devs) > 0 {
		b.Queue(lockDevicesSQL(len(devs), false), anys(devs)...)
	}
	partSQL := rebind(sqlstore.PartCheckSQL)
	for _, op := range ops {
		n := op.Create
		if n == nil {
			continue
		}
		if n.Idem != nil {
			b.Queue(`SELECT count(*) FROM idempotency_keys WHERE tenant = $1 AND key = $2`, n.Idem.Tenant, n.Idem.Key)
		}
		for _, p := range n.Lease.Parts {
			b.Queue(partSQL, sqlstore.PartCheckArgs(p)...)
		}
		if n.Limit != nil {
			b.Queue(rebind(sqlstore.LimitSQL), n.Lease.Tenant)
		}
	}
	br := c.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil { // BEGIN
		br.Close()
		return wrap("begin", err)
	}
	for range tenants {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return wrap("lock tenant", err)
		}
	}
	if len(devs) > 0 {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return wrap("lock devices", err)
		}
	}
	type span struct {
		dev      string
		off, end int64
	}
	var taken []span                     // parts of the batch's accepted creations
	keys := map[[2]string]bool{}         // their idempotency keys
	added := map[string]sqlstore.Usage{} // their charge, by tenant
	for i, op := range ops {
		n := op.Create
		if n == nil {
			continue
		}
		l := n.Lease
		var refusal error
		if n.Idem != nil {
			var used int
			if err := br.QueryRow().Scan(&used); err != nil {
				br.Close()
				return wrap("idempotency", err)
			}
			if used > 0 || keys[[2]string{n.Idem.Tenant, n.Idem.Key}] {
				refusal = fmt.Errorf("key %q used before: %w", n.Idem.Key, store.ErrDuplicate)
			}
		}
		rows := make([]sqlstore.PartRow, len(l.Parts))
		for j, p := range l.Parts {
			r := &rows[j]
			err := br.QueryRow().Scan(&r.DState, &r.DKind, &r.Capacity, &r.NodeID, &r.NState, &r.Cordoned, &r.Taken)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				if refusal == nil {
					refusal = fmt.Errorf("device %s: %w", p.DeviceID, store.ErrCapacity)
				}
				continue
			case err != nil:
				br.Close()
				return wrap("reserve", err)
			}
			for _, t := range taken {
				if t.dev == p.DeviceID && t.off < p.Offset+p.Length && p.Offset < t.end {
					r.Taken = true
				}
			}
			if refusal == nil {
				refusal = sqlstore.JudgePart(l.Kind, l.Parts, j, *r)
			}
		}
		if n.Limit != nil {
			var u sqlstore.Usage
			if err := br.QueryRow().Scan(&u.Leases, &u.BW, &u.Bytes, &u.Slots); err != nil {
				br.Close()
				return wrap("quota", err)
			}
			a := added[l.Tenant]
			u.Leases, u.BW, u.Bytes, u.Slots = u.Leases+a.Leases, u.BW+a.BW, u.Bytes+a.Bytes, u.Slots+a.Slots
			if refusal == nil {
				refusal = sqlstore.JudgeLimit(l, n.Demand, *n.Limit, u, rows)
			}
		}
		if refusal != nil {
			errs[i] = refusal
			continue
		}
		accepted[i] = true
		for _, p := range l.Parts {
			taken = append(taken, span{p.DeviceID, p.Offset, p.Offset + p.Length})
		}
		if n.Idem != nil {
			keys[[2]string{n.Idem.Tenant, n.Idem.Key}] = true
		}
		if n.Limit != nil {
			a, c := added[l.Tenant], sqlstore.Charge(l, n.Demand, rows)
			added[l.Tenant] = sqlstore.Usage{Leases: a.Leases + c.Leases, BW: a.BW + c.BW, Bytes: a.Bytes + c.Bytes, Slots: a.Slots + c.Slots}
		}
	}
	if err := br.Close(); err != nil {
		return wrap("read", err)
	}
	return nil
}

// errRecheck asks for the two round trips: a creation checked in its
// own statement (createSQL, checked) was refused, or failed on a
// constraint; the first round trip tells which, and why.
var errRecheck = errors.New("postgres: batch needs its creations judged first")

// checkable reports whether creation n can check itself in its write
// statement (createSQL, checked): it carries no limit (the tenant's
// usage is judged in Go, readForCreations) and its parts do not
// overlap one another (a refusal the statement does not look for).
func checkable(n store.NewLease) bool {
	if n.Limit != nil || len(n.Lease.Parts) == 0 {
		return false
	}
	ps := n.Lease.Parts
	for i, p := range ps {
		for _, q := range ps[:i] {
			if q.DeviceID == p.DeviceID && q.Offset < p.Offset+p.Length && q.Offset+q.Length > p.Offset {
				return false
			}
		}
	}
	return true
}

// writeError classifies an error of a pipelined write: PostgreSQL's own
// retries and lost connections are as they are; any other error
// PostgreSQL reports makes the batch take the slower way fallback names.
// For a self-checking creation that is errRecheck (a refusal, the
// statement's division by zero, or an idempotency key used before: the
// two round trips' way, where each creation is judged apart); for a write
// of the second round trip it is errSequential (a constraint, such as an
// idempotency key another replica's request used meanwhile: the
// sequential way, where the op fails alone).
func writeError(err, fallback error) error {
	if retryable(err) || unavailable(err) {
		return wrap("write", err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Errorf("%w: %w", fallback, err)
	}
	return wrap("write", err)
}

// createSQL is one statement writing a new lease, its plan, its parts,
// its idempotency key and its event. checked, it also re-checks every
// part as readForCreations and sqlstore.JudgePart would (device available,
// of the lease's kind, on its node, ready and not cordoned, the range
// inside the capacity and overlapping no live part), on what the
// transaction sees after locking the devices (earlier creations of the
// batch included), and fails with a division by zero when one does not
// fit: the batch is rolled back and written again in two round trips,
// which tell which creation was refused and why (checkError). A refusal
// is rare (the placement leader places on its own up-to-date view): the
// check saves the first round trip and two statements a creation.
func createSQL(n store.NewLease, text sqlstore.OpText, checked bool) (string, []any) {
	l, d := n.Lease, n.Demand
	nodes, devs := make([]string, len(l.Parts)), make([]string, len(l.Parts))
	offs, lens := make([]int64, len(l.Parts)), make([]int64, len(l.Parts))
	for i, p := range l.Parts {
		nodes[i], devs[i], offs[i], lens[i] = p.NodeID, p.DeviceID, p.Offset, p.Length
	}
	var idemTenant, idemKey, idemHash string
	if n.Idem != nil {
		idemTenant, idemKey, idemHash = n.Idem.Tenant, n.Idem.Key, n.Idem.RequestHash
	}
	ev := n.Event
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	q := plainCreateSQL
	if checked {
		q = checkedCreateSQL(len(l.Parts))
	}
	args := []any{l.ID, string(l.State), string(l.Kind), string(l.Mode), l.Tenant, l.Borrower, l.Size, l.StripeUnit, l.BandwidthCap, l.IOPSCap, l.URI, l.Credential, l.TTLSeconds,
		ns(l.ExpiresAt), ns(l.CreatedAt), ns(l.UpdatedAt), l.Reason, l.IdempotencyKey, text.Parts, d.Bandwidth, d.Work, ns(d.Deadline), d.Gateway,
		ns(l.CreatedAt), l.ID, text.Plan, text.Plan,
		l.ID, nodes, devs, offs, lens,
		idemTenant, idemKey, idemHash, l.ID, ns(l.CreatedAt), idemKey,
		ns(ev.At), ev.Type, ev.Subject, ev.Message, ev.State, ev.Type}
	if checked {
		args = append(args, string(l.Kind))
		for i := range l.Parts {
			args = append(args, nodes[i], devs[i], offs[i], lens[i])
		}
	}
	return q, args
}

// createCTEs write a new lease (createSQL).
const createCTEs = `WITH l AS (INSERT INTO leases (` + sqlstore.LeaseInsertCols + `, demand_bps, work_bytes, deadline_at, gateway)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)),
		p AS (INSERT INTO lease_plans (created_at, lease_id, plan) SELECT ?, ?, ?::text WHERE ?::text <> ''),
		x AS (INSERT INTO lease_parts (lease_id, idx, node_id, device_id, off, length, uri, live)
			SELECT ?, t.i - 1, t.node, t.dev, t.off, t.len, '', 1
			FROM unnest(?::text[], ?::text[], ?::bigint[], ?::bigint[]) WITH ORDINALITY AS t(node, dev, off, len, i)),
		k AS (INSERT INTO idempotency_keys (tenant, key, request_hash, lease_id, created_at) SELECT ?::text, ?::text, ?, ?, ? WHERE ?::text <> ''),
		e AS (INSERT INTO events (at, type, subject, message, state) SELECT ?, ?::text, ?, ?, ? WHERE ?::text <> '')`

var plainCreateSQL = rebind(createCTEs + ` SELECT 1`)

// checkedCreateSQL is createSQL's statement that checks its n parts
// first (n > 0). The check (ok) sees what the statement found when it
// started: not the parts it inserts itself (its parts do not overlap one
// another: checkable). Its part conditions are sqlstore.JudgePart's. The
// parts are a VALUES list of n rows, not an unnest of arrays, and a live
// part's device, node and overlapping live parts are looked up with a
// scalar subquery each: the planner knows how many rows it checks, so
// that a connection keeps one generic plan (with arrays, whose length it
// guesses, it found every custom plan cheaper and planned each call
// again, 0.27 ms a creation), and that plan finds them by index whatever
// the tables held when it was made (a join planned on a fresh database
// scanned the devices: TestCreationPlans).
func checkedCreateSQL(n int) string {
	if q, ok := checkedSQL.Load(n); ok {
		return q.(string)
	}
	var b strings.Builder
	b.WriteString(createCTEs + `,
		ok AS (SELECT bool_and(coalesce((SELECT d.node_id = t.node AND d.state = 'available' AND n.state = 'ready'
				AND n.cordoned = 0 AND d.kind = ?::text AND t.off >= 0 AND t.len > 0 AND t.off <= d.capacity - t.len
				AND (SELECT 1 FROM lease_parts lp WHERE lp.device_id = d.id AND lp.live = 1 AND lp.off < t.off + t.len AND lp.off + lp.length > t.off LIMIT 1) IS NULL
				AND (SELECT 1 FROM wipes w WHERE w.device_id = d.id AND w.off < t.off + t.len AND w.off + w.length > t.off LIMIT 1) IS NULL
				FROM devices d JOIN nodes n ON n.id = d.node_id WHERE d.id = t.dev), false)) AS pass
			FROM (VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?::text, ?::text, ?::bigint, ?::bigint)")
	}
	b.WriteString(`) AS t(node, dev, off, len))
		SELECT 1 / (SELECT pass::int FROM ok)`)
	q := rebind(b.String())
	checkedSQL.Store(n, q)
	return q
}

var checkedSQL sync.Map // part count → checkedCreateSQL

// lockDevicesSQL locks the rows of n devices (sorted), in ID order. The
// IDs are n parameters, not an array, for the reason given at
// checkedCreateSQL. With events it then takes the event log's lock in
// shared mode (two more parameters: lockClass, lockEvents), after the
// devices' (the aggregate's output is computed once every row is locked):
// a batch written in one round trip saves a statement.
func lockDevicesSQL(n int, events bool) string {
	key := n
	if events {
		key = -n
	}
	if q, ok := lockSQL.Load(key); ok {
		return q.(string)
	}
	q := `SELECT count(*)`
	if events {
		q += `, pg_advisory_xact_lock_shared($` + strconv.Itoa(n+1) + `, $` + strconv.Itoa(n+2) + `)`
	}
	q += ` FROM (SELECT id FROM devices WHERE id IN ($1`
	for i := 2; i <= n; i++ {
		q += ", $" + strconv.Itoa(i)
	}
	q += `) ORDER BY id FOR UPDATE) locked`
	lockSQL.Store(key, q)
	return q
}

var lockSQL sync.Map // device count (negative: with the event log's lock) → lockDevicesSQL

// anys is ss as arguments.
func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// transitionSQL is one statement doing a transition's compare-and-set,
// recording the parts' URIs, freeing the parts of a lease that ends,
// replacing its plan and appending its event, all only if the
// compare-and-set succeeded; it returns the lease's row (no row: it was
// refused).
func transitionSQL(t store.Transition, plan string) (string, []any) {
	ch := t.Change
	set, args := sqlstore.ChangeSet(ch, make([]any, 0, 24+len(ch.From)+2*len(ch.URIs)))
	set += partsSet(ch, &args)
	// No source state: nothing matches (a conflict).
	from := []string{""}
	for _, f := range ch.From {
		from = append(from, string(f))
	}
	// The lease's row and parts are found by their primary keys only
	// (see planGuard).
	where := ` WHERE id = ? AND state = ANY(?::text[])`
	args = append(args, t.ID, from)
	if ch.Tenant != "" {
		where += ` AND (tenant = ?) IS TRUE`
		args = append(args, ch.Tenant)
	}
	if !ch.ExpiredBy.IsZero() {
		where += ` AND expires_at < ?`
		args = append(args, ns(ch.ExpiredBy))
	}
	var q strings.Builder
	q.WriteString(`WITH u AS (UPDATE leases SET ` + set + where + ` RETURNING ` + sqlstore.LeaseCols + `)`)
	if ch.To.Terminal() {
		q.WriteString(`, f AS (UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live + 0 = 1 AND EXISTS (SELECT 1 FROM u))`)
		args = append(args, t.ID)
	} else if len(ch.LostParts) > 0 {
		q.WriteString(`, fl AS (UPDATE lease_parts SET live = 0 WHERE lease_id = ? AND live + 0 = 1 AND idx = ANY(?::bigint[]) AND EXISTS (SELECT 1 FROM u))`)
		args = append(args, t.ID, lostIdx(ch.LostParts))
	}
	if ch.Plan != nil {
		q.WriteString(`, pl AS (INSERT INTO lease_plans (created_at, lease_id, plan) SELECT created_at, id, ?::text FROM leases WHERE id = ? AND EXISTS (SELECT 1 FROM u)
			ON CONFLICT (created_at, lease_id) DO UPDATE SET plan = excluded.plan)`)
		args = append(args, plan, t.ID)
	}
	ev := t.Event
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	if ev.Type != "" {
		q.WriteString(`, e AS (INSERT INTO events (at, type, subject, message, state) SELECT ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM u))`)
		args = append(args, ns(ev.At), ev.Type, ev.Subject, ev.Message, ev.State)
	}
	q.WriteString(` SELECT * FROM u`)
	return rebind(q.String()), args
}

// planGuard: a transition's statement names its lease by primary key,
// but its other conditions could use an index too (the tenant's,
// leases_by_tenant; live = 1, which the partial indexes on lease_parts
// carry). A connection caches a statement's generic plan after a few
// executions, planned on what the statistics said then: on tables new and
// never analyzed (a fresh database) the planner finds every index as
// cheap, and it picked leases_by_tenant for a release's compare-and-set
// and parts_live_by_node for freeing its parts, then kept those plans,
// scanning every lease of the tenant and every part ever freed (dead
// entries included) on each release, more with every lease created (0.7 ms
// and 3,000 rows removed by filter after a 10 s benchmark run, seen with
// auto_explain). The conditions are therefore written so that no index
// but the primary key's can serve them: "(tenant = $n) IS TRUE" and
// "live + 0 = 1" mean what "tenant = $n" and "live = 1" do (both columns
// are NOT NULL) and match no index.

// partsSet is the SET clause's part for a change's parts (their URIs, the
// parts lost), its arguments appended to args; "" if it changes none. The
// parts become NULL — a NOT NULL violation — when the change names a part
// the lease lacks.
func partsSet(ch store.LeaseChange, args *[]any) string {
	if len(ch.URIs) == 0 && len(ch.LostParts) == 0 {
		return ""
	}
	expr := `parts::jsonb`
	need := len(ch.URIs)
	for i, u := range ch.URIs {
		expr = `jsonb_set(` + expr + `, ?::text[], to_jsonb(?::text))`
		*args = append(*args, []string{strconv.Itoa(i), "uri"}, u)
	}
	for _, i := range ch.LostParts {
		if i < 0 {
			return `, parts = NULL`
		}
		expr = `jsonb_set(` + expr + `, ?::text[], to_jsonb(?::text))`
		*args = append(*args, []string{strconv.Itoa(i), "state"}, string(api.PartLost))
		need = max(need, i+1)
	}
	return `, parts = CASE WHEN jsonb_array_length(parts::jsonb) >= ` + strconv.Itoa(need) + ` THEN (` + expr + `)::text ELSE NULL END`
}

// lostIdx are the indexes of lost parts as the statement takes them.
func lostIdx(idx []int) []int64 {
	out := make([]int64, len(idx))
	for k, i := range idx {
		out[k] = int64(i)
	}
	return out
}
