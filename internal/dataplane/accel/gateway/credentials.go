package gateway

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// Credentials is the set of lease credentials a shared gateway accepts.
// Each borrower presents its own; Revoke ends one: the gateway stops
// accepting it and closes the connections that presented it. The zero
// value is an empty set, safe for concurrent use.
type Credentials struct {
	mu sync.Mutex
	m  map[[32]byte]*credential
}

type credential struct {
	ctx    context.Context
	cancel context.CancelFunc
	users  sync.WaitGroup
}

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
		ctx, cancel := context.WithCancel(context.Background())
		cs.m[k] = &credential{ctx: ctx, cancel: cancel}
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
	cs.mu.Unlock()
	if !ok {
		return false
	}
	c.cancel()
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
	var once sync.Once
	return c.ctx, func() { once.Do(c.users.Done) }, nil
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

func (t *sharedTarget) Session(cred []byte) (context.Context, func(), error) {
	ctx, release, err := t.cs.Session(cred)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: gateway %s", accel.ErrAuth, t.g.cfg.Name)
	}
	return ctx, release, nil
}
