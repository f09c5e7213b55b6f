package controlplane

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// Liveness in memory, written to the store in batches.
//
// A heartbeat of a node that this replica knows to be ready, beating on
// time with the same health and the same links up or down, changes
// nothing but its last-seen time (and its links' round-trip times): it is
// kept in memory and written with the
// others every flushPeriod (one transaction of up to maxBeatBatch
// heartbeats), instead of one write each (HashiCorp Nomad likewise keeps
// heartbeat TTL timers in memory on its leader). The store's last-seen
// times stay the shared record every replica writes and the elected
// replica's sweep reads (sweep.go), late by at most flushPeriod plus a
// write. Everything else is written before the answer, as before: a
// node's first heartbeat to this replica (its join counts as one), one
// after a silence of half its (stretched) SuspectAfter, one that changes
// its health or its links' targets or states, and one of
// a node the store had taken for suspect or down (a flush that finds a
// node not ready makes it ready again as a synchronous heartbeat would).
//
// A crash loses at most flushPeriod of last-seen times: the restart's
// grace period (Server.started) covers it.

// flushPeriod is how often a replica writes the heartbeats it kept in
// memory: half the base heartbeat interval, so that the store's last-seen
// times lag by well under SuspectAfter.
func (s *Server) flushPeriod() time.Duration { return s.cfg.HeartbeatInterval / 2 }

// liveness is what a replica knows of the nodes that beat to it. The zero
// value is ready to use; its methods are safe for concurrent use.
type liveness struct {
	// wmu orders the writes: heartbeats written before the answer hold
	// it shared, a flush exclusively, so that a flush never writes a
	// node's older heartbeat over a newer one written meanwhile.
	wmu     sync.RWMutex
	mu      sync.Mutex
	seen    map[string]liveEntry  // node ID → last heartbeat here, while known ready
	pending map[string]store.Beat // node ID → latest heartbeat not yet written

	// taken, when set (tests), runs in a flush between taking the
	// heartbeats kept in memory and writing them.
	taken func()
}

type liveEntry struct {
	at     time.Time // the last heartbeat recorded here
	health string
	links  string // linkKey of its links
	wiping string // wipingKey of the leases its lender wipes
}

// wipingKey is a heartbeat's list of leases being wiped, written before
// the answer when it changes: the store's marks of ranges being wiped
// are forgotten by what it records (wiping.go).
func wipingKey(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return strings.Join(ids, ",")
}

// linkKey is what of a heartbeat's links is written before the answer
// when it changes: which targets, up or down (round-trip times are not).
func linkKey(links []api.Link) string {
	if len(links) == 0 {
		return ""
	}
	ks := make([]string, len(links))
	for i, l := range links {
		ks[i] = l.To + "=" + l.Status
	}
	slices.Sort(ks)
	return strings.Join(ks, ",")
}

// deferBeat keeps b in memory if its node is known ready here and beat
// within window before b with the same health and links up or down to the
// same targets; it reports whether it did (else
// the caller writes b now and calls wrote).
func (l *liveness) deferBeat(b store.Beat, window time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.seen[b.NodeID]
	if !ok || e.health != b.Health || b.At.Sub(e.at) >= window || b.At.Before(e.at) {
		return false
	}
	lk := linkKey(b.Links)
	if lk != e.links || wipingKey(b.Wiping) != e.wiping {
		return false
	}
	l.seen[b.NodeID] = liveEntry{at: b.At, health: b.Health, links: lk, wiping: e.wiping}
	if l.pending == nil {
		l.pending = map[string]store.Beat{}
	}
	l.pending[b.NodeID] = b
	return true
}

// wrote records that b was written and its node is ready.
func (l *liveness) wrote(b store.Beat) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]liveEntry{}
	}
	if e, ok := l.seen[b.NodeID]; !ok || !b.At.Before(e.at) {
		l.seen[b.NodeID] = liveEntry{at: b.At, health: b.Health, links: linkKey(b.Links), wiping: wipingKey(b.Wiping)}
	}
}

// dropPending forgets node id's heartbeat kept in memory, if any: a newer
// one is being written.
func (l *liveness) dropPending(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, id)
}

// forget drops node id: its next heartbeat is written before the answer
// (a rejoin, a removal, a flush that failed). A heartbeat of a removed
// node that a flush had already taken, or that was in flight when it was
// removed, is refused by the store (store.Store's Heartbeat: removal is
// final), on this replica or any other.
func (l *liveness) forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.seen, id)
	delete(l.pending, id)
}

// take returns the heartbeats kept in memory and empties the set.
func (l *liveness) take() []store.Beat {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) == 0 {
		return nil
	}
	out := make([]store.Beat, 0, len(l.pending))
	for _, b := range l.pending {
		out = append(out, b)
	}
	clear(l.pending)
	return out
}

// lastSeen is node id's last heartbeat here, if it is kept in memory and
// not yet written.
func (l *liveness) lastSeen(id string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.pending[id]
	return b.At, ok
}

// recordBeat records heartbeat b: in memory when it changes nothing but
// the last-seen time, else written now. It returns the node's state
// before b.
func (s *Server) recordBeat(ctx context.Context, b store.Beat) (api.NodeState, error) {
	window := stretch(s.cfg.SuspectAfter, s.heartbeatStretch()) / 2
	if s.live.deferBeat(b, window) {
		return api.NodeReady, nil
	}
	s.live.wmu.RLock()
	s.live.dropPending(b.NodeID)
	prev, err := s.beats.do(ctx, s.st, b)
	s.live.wmu.RUnlock()
	if err != nil {
		return prev, err
	}
	s.live.wrote(b)
	return prev, nil
}

// flushBeats writes the heartbeats kept in memory, in transactions of up
// to maxBeatBatch. A node the store had taken for suspect or down is
// ready again, as after a synchronous heartbeat; one whose write failed
// is forgotten, so that its next heartbeat is written before the answer.
func (s *Server) flushBeats(ctx context.Context) {
	s.live.wmu.Lock()
	defer s.live.wmu.Unlock()
	beats := s.live.take()
	if s.live.taken != nil {
		s.live.taken()
	}
	for len(beats) > 0 {
		batch := beats[:min(len(beats), maxBeatBatch)]
		beats = beats[len(batch):]
		if s.beats.size != nil {
			s.beats.size.Observe(float64(len(batch)))
		}
		prev, errs, err := s.st.Heartbeats(ctx, batch)
		for i, b := range batch {
			switch {
			case err != nil || errs[i] != nil:
				s.live.forget(b.NodeID)
			case prev[i] != api.NodeReady:
				s.readyAgain(ctx, b.NodeID, prev[i])
			}
		}
		if err != nil {
			s.log.Warn("writing heartbeats kept in memory; their nodes' next heartbeats are written at once", "heartbeats", len(batch), "err", err)
		}
	}
}

// readyAgain follows a heartbeat that made a node ready again.
func (s *Server) readyAgain(ctx context.Context, nodeID string, was api.NodeState) {
	s.log.Info("node ready again", "node", nodeID, "was", was)
	if n, err := s.st.Node(ctx, nodeID); err == nil {
		s.peers.add(n.Node)
	}
	s.invalidate()
}

// flushLoop writes the heartbeats kept in memory every flushPeriod until
// ctx ends, and once more then (within a few seconds).
func (s *Server) flushLoop(ctx context.Context) {
	t := s.clock.NewTicker(s.flushPeriod())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			s.flushBeats(fctx)
			cancel()
			return
		case <-t.C():
			s.flushBeats(ctx)
		}
	}
}
