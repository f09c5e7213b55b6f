package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// This file makes a revocation (rialto node remove) effective on every
// replica of a shared store before the removal returns, not when caches
// expire. The replicas talk over the store's broadcast channel
// (store.Broadcaster: PostgreSQL's LISTEN/NOTIFY):
//
//   - every replica says hello every busHello, stamped with its own clock;
//     a replica trusts its token cache (and its copy of the revocation
//     list) only while the newest hello of its own that came back was sent
//     within busStale. Messages arrive in the order they committed, so a
//     replica that missed a revocation is one that has not heard itself
//     since: it looks every token up in the store and signs its
//     revocation list from the store's (crlstore.go) before checking a
//     certificate, until it hears itself again (and, on listening anew,
//     forgets its whole cache first);
//   - the replica that removes a node broadcasts the revocation (the node,
//     the serial numbers of the certificates it revoked, recorded in the
//     store before); every other replica forgets the node's cached
//     credential, signs its revocation list from the store's (revoking
//     those serials in its CA directory itself should it not read the
//     store) and answers with an acknowledgement;
//   - the remover waits for the acknowledgements of every replica it heard
//     within 2×busStale, at most busStale after its broadcast: by then a
//     replica that has not handled the revocation has not heard itself
//     within busStale either, and so trusts no cache.
//
// Wall-clock time (time.Now), not the Server's clock: this is about the
// liveness of the database's connections, as the election is.

const (
	busHello = time.Second
	busStale = 3 * time.Second
)

// busMsg is one message on the broadcast channel. Nothing secret goes in
// it: node IDs and certificate serial numbers.
type busMsg struct {
	T       string   `json:"t"` // hello, revoke, ack
	From    string   `json:"from"`
	At      int64    `json:"at,omitempty"` // hello: the sender's clock, Unix ns
	Seq     string   `json:"seq,omitempty"`
	Node    string   `json:"node,omitempty"`
	Serials []string `json:"serials,omitempty"` // hex
}

// replicaBus is a Server's side of the broadcast channel. Zero value: not
// listening (a shared store's Server then trusts no cache).
type replicaBus struct {
	id      string
	freshAt atomic.Int64 // send time (Unix ns) of the newest own hello heard

	mu      sync.Mutex
	seen    map[string]time.Time   // replica → when its last hello came
	waiters map[string]chan string // revocation seq → the replicas acknowledging
}

// cacheTrusted reports whether s may answer from its token cache: always
// for a store of its own; for a shared store, while it hears itself on the
// broadcast channel.
func (s *Server) cacheTrusted() bool {
	if _, shared := s.st.(store.Broadcaster); !shared {
		return true
	}
	return time.Since(time.Unix(0, s.bus.freshAt.Load())) < busStale
}

// newBusID is a replica's name on the broadcast channel: New gives it
// one before anything it does at its start may broadcast (finishRemovals
// revoking what a stopped removal missed), since the other replicas drop
// a message that names no sender.
func newBusID() string {
	var id [8]byte
	rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

// runBus listens on the broadcast channel and says hello until ctx ends;
// the returned function waits for its goroutines.
func (s *Server) runBus(ctx context.Context, b store.Broadcaster) (wait func()) {
	s.bus.mu.Lock()
	if s.bus.id == "" {
		s.bus.id = newBusID()
	}
	s.bus.seen = map[string]time.Time{}
	s.bus.waiters = map[string]chan string{}
	s.bus.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // owned by runBus's caller: ends with ctx, waited for by wait
		defer wg.Done()
		s.listenBus(ctx, b)
	}()
	go func() { // likewise
		defer wg.Done()
		t := time.NewTicker(busHello)
		defer t.Stop()
		for {
			s.sayHello(ctx, b)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return wg.Wait
}

func (s *Server) sayHello(ctx context.Context, b store.Broadcaster) {
	if s.cfg.CA != nil {
		// Revocations by another replica (recorded in the store) or
		// another process sharing the CA directory, within a hello.
		if _, err := s.syncCRL(ctx); err != nil {
			s.log.Warn("reading the revocation list", "err", err)
		}
	}
	m, _ := json.Marshal(busMsg{T: "hello", From: s.bus.id, At: time.Now().UnixNano()})
	hctx, cancel := context.WithTimeout(ctx, busStale)
	defer cancel()
	if err := b.Broadcast(hctx, string(m)); err != nil && ctx.Err() == nil {
		s.log.Debug("broadcast hello", "err", err)
	}
}

// listenBus listens until ctx ends, again after each failure.
func (s *Server) listenBus(ctx context.Context, b store.Broadcaster) {
	for {
		err := b.Listen(ctx, func() { s.busListening(ctx) }, func(msg string) { s.busMessage(ctx, b, msg) })
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("listening to the other replicas (revocations); token cache off until it listens again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(busHello / 2):
		}
	}
}

// busListening runs when the replica listens (again): what it missed
// meanwhile may have been revocations, so it forgets its cache and
// re-reads the revocation list.
func (s *Server) busListening(ctx context.Context) {
	s.auth.clear()
	if s.cfg.CA != nil {
		if _, err := s.syncCRL(ctx); err != nil {
			s.log.Warn("reading the revocation list", "err", err)
		}
	}
}

func (s *Server) busMessage(ctx context.Context, b store.Broadcaster, raw string) {
	var m busMsg
	if err := json.Unmarshal([]byte(raw), &m); err != nil || m.From == "" {
		s.log.Warn("a message of another replica that this one does not read", "err", err)
		return
	}
	self := m.From == s.bus.id
	switch m.T {
	case "hello":
		s.bus.mu.Lock()
		s.bus.seen[m.From] = time.Now()
		s.bus.mu.Unlock()
		if self && m.At > s.bus.freshAt.Load() {
			s.bus.freshAt.Store(m.At)
		}
	case "revoke":
		if self {
			return // applied before it was sent
		}
		s.applyRevocation(ctx, m.Node, m.Serials)
		a, _ := json.Marshal(busMsg{T: "ack", From: s.bus.id, Seq: m.Seq})
		actx, cancel := context.WithTimeout(ctx, busStale)
		defer cancel()
		if err := b.Broadcast(actx, string(a)); err != nil && ctx.Err() == nil {
			s.log.Warn("acknowledging a revocation", "node", m.Node, "err", err)
		}
	case "ack":
		s.bus.mu.Lock()
		ch := s.bus.waiters[m.Seq]
		s.bus.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m.From:
			default: // the remover stopped waiting
			}
		}
	}
}

// applyRevocation makes another replica's removal of node effective here.
func (s *Server) applyRevocation(ctx context.Context, node string, serials []string) {
	s.auth.dropNode(node)
	s.live.forget(node) // its heartbeats in flight are written (and refused) at once
	// Its claims on parts (unserved.go) are moot: a node that takes it
	// over does not hold what it held.
	s.unserved.forget(node)
	s.invalidate()
	if s.cfg.CA == nil {
		return
	}
	// The remover recorded them in the store before it broadcast them:
	// this replica's list, signed from the store's, names them.
	if _, err := s.syncCRL(ctx); err != nil {
		s.log.Warn("signing the revocation list from the store; revoking the removed node's certificates in this replica's CA directory only meanwhile", "err", err)
	}
	for _, n := range parseSerials(serials) {
		if s.cfg.CA.Revoked(n) {
			continue
		}
		// Not in the store's list (a store that does not keep it, or
		// unreachable): revoke it here.
		if err := s.cfg.CA.Revoke(n); err != nil {
			s.log.Error("revoking a removed node's certificate on this replica", "node", node, "serial", n.Text(16), "err", err)
		}
	}
	s.log.Info("node removed on another replica: its credential and certificates refused here", "node", node, "certificates", len(serials))
}

// broadcastRevocation tells the other replicas that node was removed and
// its certificates serials revoked, and waits until each replica heard
// within 2×busStale acknowledged it, or busStale passed (see the top of
// this file). It returns the replicas that did not acknowledge.
func (s *Server) broadcastRevocation(ctx context.Context, node string, serials []*big.Int) []string {
	b, ok := s.st.(store.Broadcaster)
	if !ok {
		return nil
	}
	var seq [8]byte
	rand.Read(seq[:])
	m := busMsg{T: "revoke", From: s.bus.id, Seq: hex.EncodeToString(seq[:]), Node: node, Serials: serialTexts(serials)}
	raw, _ := json.Marshal(m)
	ch := make(chan string, 16)
	s.bus.mu.Lock()
	if s.bus.waiters == nil {
		s.bus.waiters = map[string]chan string{}
	}
	s.bus.waiters[m.Seq] = ch
	want := map[string]bool{}
	for id, at := range s.bus.seen {
		if id != s.bus.id && time.Since(at) < 2*busStale {
			want[id] = true
		}
	}
	s.bus.mu.Unlock()
	defer func() {
		s.bus.mu.Lock()
		delete(s.bus.waiters, m.Seq)
		s.bus.mu.Unlock()
	}()
	if err := b.Broadcast(ctx, string(raw)); err != nil {
		// The others learn it when they listen again, or see their
		// caches expire: say so.
		s.log.Error("broadcasting a revocation to the other replicas", "node", node, "err", err)
	}
	deadline := time.NewTimer(busStale)
	defer deadline.Stop()
	for len(want) > 0 {
		select {
		case id := <-ch:
			delete(want, id)
		case <-deadline.C:
			return missing(want)
		case <-ctx.Done():
			return missing(want)
		}
	}
	return nil
}

func missing(want map[string]bool) []string {
	out := make([]string, 0, len(want))
	for id := range want {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// serialTexts is serials as the broadcast channel and the store carry
// them: hexadecimal.
func serialTexts(serials []*big.Int) []string {
	out := make([]string, 0, len(serials))
	for _, n := range serials {
		out = append(out, n.Text(16))
	}
	return out
}

// parseSerials reads serialTexts back, leaving out what is not a serial
// number.
func parseSerials(texts []string) []*big.Int {
	var out []*big.Int
	for _, h := range texts {
		if n, ok := new(big.Int).SetString(h, 16); ok && n.Sign() > 0 {
			out = append(out, n)
		}
	}
	return out
}
