package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

type role int

const (
	roleBootstrap role = iota + 1
	roleNode
	roleTenant
)

func (r role) String() string {
	switch r {
	case roleBootstrap:
		return "bootstrap token"
	case roleNode:
		return "node credential"
	case roleTenant:
		return "tenant token"
	}
	return "no token"
}

// principal is who made a request.
type principal struct {
	role   role
	nodeID string // roleNode
	tenant string // roleTenant
	admin  bool
	fp     string // fingerprint of the secret, safe to log
}

// authenticate resolves the bearer token. It never logs the secret. A
// node's call on a connection that presented a certificate since revoked
// is refused (checkPeerRevoked); other callers' certificates authenticate
// nothing (a removed node's machine joins again with the bootstrap token
// while it still presents its old certificate).
func (s *Server) authenticate(ctx context.Context, r *http.Request) (principal, error) {
	p, err := s.resolveToken(ctx, r)
	if err == nil && p.role == roleNode {
		if err := s.checkPeerRevoked(r); err != nil {
			return principal{}, err
		}
	}
	return p, err
}

func (s *Server) resolveToken(ctx context.Context, r *http.Request) (principal, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return principal{}, fmt.Errorf("%w: missing Authorization: Bearer <token> header", ErrUnauthorized)
	}
	scheme, tok, ok := strings.Cut(h, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return principal{}, fmt.Errorf("%w: Authorization header must be \"Bearer <token>\"", ErrUnauthorized)
	}
	hash := resource.HashSecret(tok)
	trusted := s.cacheTrusted()
	if trusted {
		if p, ok := s.auth.get(hash, s.now()); ok {
			return p, nil
		}
	}
	gen := s.auth.generation()
	at := s.now()
	p, err := s.lookupPrincipal(ctx, hash, resource.Fingerprint(tok), strings.HasPrefix(tok, nodeCredentialPrefix+"_"))
	if err == nil {
		s.auth.put(hash, p, at, gen)
	}
	return p, err
}

// checkPeerRevoked refuses a node's request whose connection presented a
// revoked client certificate, revoked before the handshake (which takes
// it: APIServerTLS) or since, and wrap closes that connection. A replica
// that has not heard itself lately on the broadcast channel (revoke.go)
// re-reads the revocation list first.
func (s *Server) checkPeerRevoked(r *http.Request) error {
	if s.cfg.CA == nil || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil
	}
	if !s.cacheTrusted() {
		if _, err := s.syncCRL(r.Context()); err != nil {
			return fmt.Errorf("%w: cannot read the revocation list: %v", ErrUnavailable, err)
		}
	}
	if err := s.cfg.CA.VerifyPeer(*r.TLS); err != nil {
		return fmt.Errorf("%w: client certificate: %w", ErrUnauthorized, err)
	}
	return nil
}

// nodeCredentialPrefix starts the node credentials join makes: those are
// looked up among the nodes first (one query instead of two for every
// agent's first heartbeat to a replica).
const nodeCredentialPrefix = "rnc"

// cachePrincipal remembers p for the token of hash.
func (s *Server) cachePrincipal(hash string, p principal) {
	s.auth.put(hash, p, s.now(), s.auth.generation())
}

// authLifetime is how long a cached principal is used after its lookup:
// max(authCacheTTL, twice the heartbeat interval agents are told now,
// stretched with the cluster's size: replica.go), so that an agent's next
// heartbeat finds its entry. It is read when an entry is read, not fixed
// when it is cached: an agent that joined while the interval was short
// and was then told a stretched one still finds the entry its join made.
func (s *Server) authLifetime() time.Duration {
	return max(authCacheTTL, 2*s.heartbeatInterval())
}

func (s *Server) lookupPrincipal(ctx context.Context, hash, fp string, nodeFirst bool) (principal, error) {
	if nodeFirst {
		if n, err := s.st.NodeByCredential(ctx, hash); err == nil {
			return principal{role: roleNode, nodeID: n.ID, fp: fp}, nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return principal{}, err
		}
	}
	t, err := s.st.LookupToken(ctx, hash)
	switch {
	case err == nil:
		switch t.Kind {
		case store.TokenBootstrap:
			return principal{role: roleBootstrap, fp: fp}, nil
		case store.TokenTenant:
			return principal{role: roleTenant, tenant: t.Tenant, admin: t.Admin, fp: fp}, nil
		}
		return principal{}, fmt.Errorf("%w: token of unknown kind", ErrUnauthorized)
	case !errors.Is(err, store.ErrNotFound):
		return principal{}, err
	}
	n, err := s.st.NodeByCredential(ctx, hash)
	switch {
	case err == nil:
		return principal{role: roleNode, nodeID: n.ID, fp: fp}, nil
	case errors.Is(err, store.ErrNotFound):
		return principal{}, fmt.Errorf("%w: unknown or revoked token (%s)", ErrUnauthorized, fp)
	}
	return principal{}, err
}

// access names who may call a route.
type access int

const (
	accessPublic    access = iota // no token
	accessBootstrap               // the bootstrap token
	accessNode                    // a node credential (the route checks which node)
	accessTenant                  // a tenant token (admin or not)
	accessReader                  // a tenant token or a node credential
	accessWriter                  // an admin tenant token or a node credential
)

func (a access) String() string {
	switch a {
	case accessPublic:
		return "none"
	case accessBootstrap:
		return "bootstrap token"
	case accessNode:
		return "node credential"
	case accessTenant:
		return "tenant token"
	case accessReader:
		return "tenant token or node credential"
	case accessWriter:
		return "admin tenant token or node credential"
	}
	return "?"
}

func (a access) allows(p principal) bool {
	switch a {
	case accessPublic:
		return true
	case accessBootstrap:
		return p.role == roleBootstrap
	case accessNode:
		return p.role == roleNode
	case accessTenant:
		return p.role == roleTenant
	case accessReader:
		return p.role == roleTenant || p.role == roleNode
	case accessWriter:
		return (p.role == roleTenant && p.admin) || p.role == roleNode
	}
	return false
}

// canSee reports whether p may see (and change) lease l.
func (p principal) canSee(l api.Lease) bool {
	return p.role == roleTenant && (p.admin || p.tenant == l.Tenant)
}

// redact hides a lease's secrets from anyone but its owner.
func (p principal) redact(l api.Lease) api.Lease {
	if p.role == roleTenant && p.tenant == l.Tenant {
		return l
	}
	l.Credential = ""
	l.URI = ""
	parts := make([]api.Part, len(l.Parts))
	for i, pt := range l.Parts {
		pt.URI = ""
		parts[i] = pt
	}
	l.Parts = parts
	if l.Plan != nil {
		pl := *l.Plan
		pl.Parts = make([]api.Part, len(l.Plan.Parts))
		for i, pt := range l.Plan.Parts {
			pt.URI = ""
			pl.Parts[i] = pt
		}
		l.Plan = &pl
	}
	return l
}

// authCache remembers resolved principals by token hash for a while (life,
// read on every get), so that heartbeats do not cost two lookups each.
// Unknown tokens are not cached. A rejoin drops the node's entries, so a replaced node
// credential stops working at once. Every drop moves the cache to a new
// generation, and a lookup that started in an older one is not cached (it
// may have read the store before the change the drop stands for).
type authCache struct {
	mu  sync.Mutex
	m   map[string]authEntry
	gen uint64
	// changed is closed (and replaced) by every drop: an open event
	// stream then checks its caller again (stream.go).
	changed chan struct{}
	// life, when set (New sets it), is how long an entry is used after
	// its lookup, read when the entry is read; authCacheTTL otherwise.
	life func() time.Duration
}

type authEntry struct {
	p  principal
	at time.Time // when it was looked up (or the node joined)
}

// authCacheTTL is the least time an entry is kept.
const authCacheTTL = 10 * time.Second

func (c *authCache) get(hash string, now time.Time) (principal, bool) {
	life := authCacheTTL
	if c.life != nil {
		life = c.life()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[hash]
	if !ok || now.Sub(e.at) > life {
		return principal{}, false
	}
	return e.p, true
}

// changes returns a channel closed at the cache's next drop (a reload of
// the tokens, a node's rejoin or removal, here or on another replica, a
// replica listening anew).
func (c *authCache) changes() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	return c.changed
}

// nextGenLocked moves the cache to a new generation and wakes those
// waiting on changes.
func (c *authCache) nextGenLocked() {
	c.gen++
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// generation is the cache's generation, for put.
func (c *authCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put caches p, looked up at time at, unless the cache was dropped from
// since generation gen.
func (c *authCache) put(hash string, p principal, at time.Time, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if c.m == nil || len(c.m) > 100000 {
		c.m = map[string]authEntry{}
	}
	c.m[hash] = authEntry{p, at}
}

// dropNode forgets the entries of node id.
func (c *authCache) dropNode(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextGenLocked()
	for h, e := range c.m {
		if e.p.role == roleNode && e.p.nodeID == id {
			delete(c.m, h)
		}
	}
}

// clear forgets every entry.
func (c *authCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextGenLocked()
	c.m = nil
}
