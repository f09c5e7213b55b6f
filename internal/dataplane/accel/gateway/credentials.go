package gateway

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// Credentials is the set of lease credentials a shared gateway accepts.
// Each borrower presents its own; Revoke ends one: the gateway stops
// accepting it and closes the connections that presented it. The zero
// value is an empty set with no per-credential limit, safe for concurrent
// use; set Limit before the first Add.
type Credentials struct {
	// Limit bounds the items one credential may have queued or running in
	// the gateway (0: only the gateway's QueueLimit), so that one borrower
	// cannot fill the queue the others share; beyond it calls fail with
	// ErrLeaseQueueFull.
	Limit int

	mu sync.Mutex
	m  map[[32]byte]*credential
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
	pending  atomic.Int64
}

type credKey struct{}

// key hashes a credential so that lookups do not leak its bytes through
// timing (map lookups compare keys byte by byte).
func key(c []byte) [32]byte { return sha256.Sum256(c) }

// Add starts accepting cred. Adding a credential already present is a
// no-op; an empty credential is refused.
func (cs *Credentials) Add(cred []byte) error {
	if len(cred) == 0 {
		return fmt.Errorf("%w: empty credential", accel.ErrAuth)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[[32]byte]*credential{}
	}
	k := key(cred)
	if _, ok := cs.m[k]; !ok {
		cs.m[k] = &credential{sessions: map[int]context.CancelFunc{}}
	}
	return nil
}

// Revoke stops accepting cred, closes the connections that presented it
// and waits until they have ended. It reports whether cred was accepted.
func (cs *Credentials) Revoke(cred []byte) bool {
	cs.mu.Lock()
	k := key(cred)
	c, ok := cs.m[k]
	delete(cs.m, k)
	var cancels []context.CancelFunc
	if ok {
		for _, cancel := range c.sessions {
			cancels = append(cancels, cancel)
		}
	}
	cs.mu.Unlock()
	if !ok {
		return false
	}
	for _, cancel := range cancels {
		cancel()
	}
	c.users.Wait()
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
	return &sharedTarget{target: target{g: g, auth: cs.Check}, cs: cs}
}

type sharedTarget struct {
	target
	cs *Credentials
}

// Execute admits the call against its credential's share of the queue.
func (t *sharedTarget) Execute(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	if c, ok := ctx.Value(credKey{}).(*credential); ok && t.cs.Limit > 0 {
		n := int64(len(ins))
		if p := c.pending.Add(n); p > int64(t.cs.Limit) {
			c.pending.Add(-n)
			t.g.rejected.Add(1)
			t.g.count("rejected")
			return nil, fmt.Errorf("%w (%d items, limit %d)", ErrLeaseQueueFull, p-n, t.cs.Limit)
		}
		defer c.pending.Add(-n)
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
