package gateway

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// Credentials is the set of lease credentials a shared gateway accepts.
// Each borrower presents its own, added with a lease name (a non-secret
// label for metrics) and a weight (its share of the gateway under
// saturation); Revoke ends one: the gateway stops accepting it, closes the
// connections that presented it and cancels its queued and running work
// (a running execution is stopped on its slot by a CANCEL frame). The
// zero value is an empty set with no per-credential limit, safe for
// concurrent use; set Limit and RevokeWait before the first Add.
type Credentials struct {
	// Limit caps the items one credential may have queued or running in
	// the gateway. Whatever it says, a lease may hold at most its weighted
	// part of the gateway's QueueLimit (weight / the sum of the accepted
	// credentials' weights; at least one batch), so that one borrower
	// cannot fill the queue the others share; beyond it calls fail with
	// ErrLeaseQueueFull. Only the items of calls whose callers still wait
	// count: a call abandoned (a deadline, a CANCEL) stops counting at
	// once, though its cancelled execution may still be returning (such
	// items may hold at most another limit). 0: the weighted part only.
	Limit int
	// RevokeWait bounds how long Revoke waits for the revoked lease's
	// cancelled executions to return (0: DefaultRevokeWait), so that a
	// teardown never waits for a runaway.
	RevokeWait time.Duration

	mu     sync.Mutex
	m      map[[32]byte]*credential
	weight int64 // sum of the accepted credentials' weights
	seq    int   // leases named so far by Add
	g      *Gateway
}

// ErrLeaseQueueFull rejects a call whose credential already has Limit
// items in the gateway (wire code Busy).
var ErrLeaseQueueFull = fmt.Errorf("gateway: this lease's share of the queue is full: %w", accel.ErrBusy)

type credential struct {
	// sessions cancels the contexts of the sessions open under the
	// credential (guarded by Credentials.mu); Revoke calls them all.
	sessions map[int]context.CancelFunc
	nextID   int
	users    sync.WaitGroup
	lease    *lease
}

type credKey struct{}

// key hashes a credential so that lookups do not leak its bytes through
// timing (map lookups compare keys byte by byte).
func key(c []byte) [32]byte { return sha256.Sum256(c) }

// Add starts accepting cred, with weight 1 and a lease name of its own
// ("lease-N"). Adding a credential already present is a no-op; an empty
// credential is refused.
func (cs *Credentials) Add(cred []byte) error {
	return cs.add(cred, "", 1, false)
}

// AddWeighted starts accepting cred for the lease named lease (a
// non-secret label: metrics and listings show it, never the credential;
// empty: "lease-N") with scheduling weight weight ≥ 1: under saturation
// the leases' served items follow their weights. Adding a credential
// already present updates its weight (its name stays).
func (cs *Credentials) AddWeighted(cred []byte, lease string, weight int) error {
	return cs.add(cred, lease, weight, true)
}

func (cs *Credentials) add(cred []byte, name string, weight int, update bool) error {
	if len(cred) == 0 {
		return fmt.Errorf("%w: empty credential", accel.ErrAuth)
	}
	if weight < 1 {
		return fmt.Errorf("%w: lease weight %d, want ≥ 1", ErrConfig, weight)
	}
	cs.mu.Lock()
	if cs.m == nil {
		cs.m = map[[32]byte]*credential{}
	}
	k := key(cred)
	c, ok := cs.m[k]
	if ok {
		var l *lease
		if update {
			cs.weight += int64(weight) - c.lease.weight.Swap(int64(weight))
			l = c.lease
		}
		g := cs.g
		cs.mu.Unlock()
		if l != nil && g != nil {
			g.setWeight(l)
		}
		return nil
	}
	if name == "" {
		cs.seq++
		name = "lease-" + strconv.Itoa(cs.seq)
	}
	c = &credential{sessions: map[int]context.CancelFunc{}, lease: newLease(name, weight)}
	cs.m[k] = c
	cs.weight += int64(weight)
	g := cs.g
	cs.mu.Unlock()
	if g != nil {
		g.join(c.lease)
	}
	return nil
}

// SetWeight changes the scheduling weight of an accepted credential
// (≥ 1); it takes effect from the lease's next batch.
func (cs *Credentials) SetWeight(cred []byte, weight int) error {
	if weight < 1 {
		return fmt.Errorf("%w: lease weight %d, want ≥ 1", ErrConfig, weight)
	}
	cs.mu.Lock()
	c, ok := cs.m[key(cred)]
	if !ok || len(cred) == 0 {
		cs.mu.Unlock()
		return accel.ErrAuth
	}
	cs.weight += int64(weight) - c.lease.weight.Swap(int64(weight))
	g := cs.g
	cs.mu.Unlock()
	if g != nil {
		g.setWeight(c.lease)
	}
	return nil
}

// SetDeadline makes dl the deadline of accepted credential cred (nil:
// none): a call of its lease that arrives once dl has passed (Execute of
// SharedTarget) is refused with accel.ErrLeaseExpired (wire code
// Unavailable), and so is a batch of its calls that a worker takes up
// then, without reaching a slot, whether or not the credential has been
// revoked yet; moving dl (clock.Deadline.Set: a renewal) serves them
// again.
func (cs *Credentials) SetDeadline(cred []byte, dl *clock.Deadline) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c, ok := cs.m[key(cred)]
	if !ok || len(cred) == 0 {
		return accel.ErrAuth
	}
	c.lease.deadline.Store(dl)
	return nil
}

// limit is the items c's lease may hold in a gateway whose queue holds
// queueLimit and whose batches hold maxBatch.
func (cs *Credentials) limit(c *credential, queueLimit, maxBatch int) int64 {
	cs.mu.Lock()
	total := cs.weight
	cs.mu.Unlock()
	n := int64(queueLimit)
	if total > 0 {
		n = max(n*c.lease.weight.Load()/total, int64(maxBatch))
	}
	if cs.Limit > 0 {
		n = min(n, int64(cs.Limit))
	}
	return n
}

// Revoke stops accepting cred, closes the connections that presented it
// and cancels its work: its queued requests are dropped and its running
// executions cancelled (on their slots too, by a CANCEL frame). It waits
// until the connections have ended and, for at most RevokeWait, until the
// lease's executions have returned. It reports whether cred was accepted.
func (cs *Credentials) Revoke(cred []byte) bool {
	cs.mu.Lock()
	k := key(cred)
	c, ok := cs.m[k]
	delete(cs.m, k)
	var cancels []context.CancelFunc
	if ok {
		cs.weight -= c.lease.weight.Load()
		for _, cancel := range c.sessions {
			cancels = append(cancels, cancel)
		}
	}
	g, wait := cs.g, cs.RevokeWait
	cs.mu.Unlock()
	if !ok {
		return false
	}
	// Every request of the lease runs under one of these sessions: ending
	// them ends the requests' contexts, which drops them from the queues
	// and cancels the executions they wait for.
	for _, cancel := range cancels {
		cancel()
	}
	c.users.Wait()
	if wait <= 0 {
		wait = DefaultRevokeWait
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	_ = c.lease.waitIdle(ctx)
	cancel()
	if g != nil {
		g.leave(c.lease)
	}
	return true
}

// Len returns the number of accepted credentials.
func (cs *Credentials) Len() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.m)
}

// Check reports whether cred is accepted (accel.ErrAuth if not).
func (cs *Credentials) Check(cred []byte) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if _, ok := cs.m[key(cred)]; !ok || len(cred) == 0 {
		return accel.ErrAuth
	}
	return nil
}

// Session checks cred and registers a user of it: ctx ends when cred is
// revoked, and release must be called when the user is done.
func (cs *Credentials) Session(cred []byte) (context.Context, func(), error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c, ok := cs.m[key(cred)]
	if !ok || len(cred) == 0 {
		return nil, nil, accel.ErrAuth
	}
	c.users.Add(1)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), credKey{}, c))
	id := c.nextID
	c.nextID++
	c.sessions[id] = cancel
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			cs.mu.Lock()
			delete(c.sessions, id)
			cs.mu.Unlock()
			cancel()
			c.users.Done()
		})
	}, nil
}

// SharedTarget exposes the gateway over the accel protocol to every holder
// of a credential in cs; a connection lives only as long as its credential
// (accel.SessionTarget).
func (g *Gateway) SharedTarget(cs *Credentials) accel.Target {
	cs.mu.Lock()
	cs.g = g
	ls := make([]*lease, 0, len(cs.m))
	for _, c := range cs.m {
		ls = append(ls, c.lease)
	}
	cs.mu.Unlock()
	for _, l := range ls {
		g.join(l)
	}
	return &sharedTarget{target: target{g: g, auth: cs.Check}, cs: cs}
}

type sharedTarget struct {
	target
	cs *Credentials
}

// Execute admits the call against its credential's share of the queue.
func (t *sharedTarget) Execute(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	if c, ok := ctx.Value(credKey{}).(*credential); ok {
		if c.lease.expired() {
			t.g.rejected.Add(1)
			t.g.count("rejected")
			return nil, fmt.Errorf("%w: lease %s", accel.ErrLeaseExpired, c.lease.name)
		}
		n := int64(len(ins))
		limit := t.cs.limit(c, t.g.cfg.QueueLimit, t.g.cfg.MaxBatch)
		release, live, ok := c.lease.admit(ctx, n, limit)
		if !ok {
			t.g.rejected.Add(1)
			t.g.count("rejected")
			return nil, fmt.Errorf("%w (%d items, limit %d)", ErrLeaseQueueFull, live, limit)
		}
		defer release()
	}
	return t.target.Execute(ctx, entry, ins)
}

func (t *sharedTarget) Session(cred []byte) (context.Context, func(), error) {
	ctx, release, err := t.cs.Session(cred)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: gateway %s", accel.ErrAuth, t.g.cfg.Name)
	}
	return ctx, release, nil
}
