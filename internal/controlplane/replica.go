package controlplane

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// This file is what changes when several control-plane replicas share one
// store (store/postgres): the election of the one replica that runs the
// background duties, the tenant limits the store re-checks, and the
// spreading of heartbeats that keeps their rate bounded as the cluster
// grows (docs/operations.md, "Replicas" and "Heartbeat spreading").

// replicaState is a Server's view of its role among replicas. The zero
// value is a lone control plane that leads.
type replicaState struct {
	leading    atomic.Bool
	leadSince  atomic.Int64 // Unix ns of the current leadership (0: since start)
	nodeCount  atomic.Int64 // nodes known (any state), for heartbeat spreading
	leaderWins atomic.Int64 // leaderships won, for tests and metrics
	// lastLiveness is when the sweep last checked node liveness (Unix ns).
	lastLiveness atomic.Int64
}

// shared reports whether the store is shared with other replicas: it
// elects a leader.
func (s *Server) shared() bool {
	_, ok := s.st.(store.Leader)
	return ok
}

// Leading reports whether this replica runs the background duties: the
// elected replica of a shared store, or a lone control plane that runs.
func (s *Server) Leading() bool { return s.rep.leading.Load() }

// LeaderWins is how many times this replica was elected.
func (s *Server) LeaderWins() int64 { return s.rep.leaderWins.Load() }

// runReplica is Run for a replica of a shared store: it campaigns for
// the leadership; while it leads it sweeps every HeartbeatInterval; when
// it loses the leadership (its database session ended) it campaigns
// again. Meanwhile every replica keeps its count of nodes (heartbeat
// spreading) and its peer lists current.
func (s *Server) runReplica(ctx context.Context, el store.Leader) error {
	done := make(chan struct{})
	go func() { // owned by runReplica: cancelled with ctx, waited for below
		defer close(done)
		s.followLoop(ctx)
	}()
	defer func() { <-done }()
	defer s.fwd.close()
	campaign := el.Campaign
	if dir, ok := el.(leaderDirectory); ok && s.fwd != nil {
		// The elected replica also places for the others (forward.go).
		campaign = func(ctx context.Context) (context.Context, func(), error) {
			return dir.CampaignAdvertising(ctx, s.fwd.self)
		}
	}
	for {
		lead, resign, err := campaign(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.Warn("leader election", "err", err)
			continue
		}
		s.rep.leadSince.Store(s.now().UnixNano())
		s.rep.leaderWins.Add(1)
		s.rep.leading.Store(true)
		s.log.Info("elected: this replica runs the background duties (liveness, expiry, interrupted work)")
		s.invalidate()
		err = s.sweepLoop(lead)
		s.rep.leading.Store(false)
		resign()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("lost the leadership (database session ended); campaigning again", "err", err)
	}
}

// sweepLoop sweeps every HeartbeatInterval until ctx ends.
func (s *Server) sweepLoop(ctx context.Context) error {
	t := s.clock.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	var damaged bool
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
			if err := s.Sweep(ctx); ctx.Err() == nil {
				s.swept(err, &damaged)
			}
		}
	}
}

// sharedLinger is how long a group commit of a shared store waits for
// more writes to join a small batch: one more write per transaction saves
// a transaction's round trips (begin, lock, commit) and commit. Lease
// writes wait at most this long, and only for the writers of the last
// batch (batch.go, leaseBatcher).
const sharedLinger = time.Millisecond

// followRefresh is how often a replica that does not sweep counts the
// nodes (heartbeat spreading); it re-reads them all (the peer lists) when
// the count changed, and every followReread anyway.
const (
	followRefresh = 5 * time.Second
	followReread  = 30 * time.Second
)

// followLoop keeps the node count of every replica and the peer lists of
// a replica that does not sweep, and (on every replica) touches the moves it runs
// (touchMoves). Its placement view is not reloaded on a timer: a view
// that missed another replica's writes costs a retry on fresh data (a
// write the store refuses, or a refusal placement gives: reserver.Place),
// and reloading the whole inventory of a big cluster is not free.
func (s *Server) followLoop(ctx context.Context) {
	t := s.clock.NewTicker(followRefresh)
	defer t.Stop()
	var last time.Time
	count := -1
	for {
		if c, err := s.st.Counts(ctx); err == nil {
			n := 0
			for _, k := range c.Nodes {
				n += k
			}
			// Every replica counts, the elected one too: its sweep counts
			// only once per stretched interval, and meanwhile the other
			// replicas' joins would make it tell too short an interval.
			s.setNodeCount(n)
			if !s.Leading() && (n != count || s.clock.Since(last) >= followReread) {
				if nodes, err := s.st.Nodes(ctx); err == nil {
					s.peers.set(nodes)
					s.setNodeCount(len(nodes))
					count, last = n, s.clock.Now()
				}
			}
		}
		s.touchMoves(ctx) // every followRefresh: moveTouch
		if !s.Leading() {
			// The elected replica's sweep does it there.
			if err := s.retryLateRevoked(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("recording the certificates revoked during a node's removal", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// setNodeCount records n nodes; the count only grows (nodes are never
// removed, and a shrinking count would shorten the liveness thresholds of
// agents still beating at a longer interval).
func (s *Server) setNodeCount(n int) {
	for {
		cur := s.rep.nodeCount.Load()
		if int64(n) <= cur || s.rep.nodeCount.CompareAndSwap(cur, int64(n)) {
			return
		}
	}
}

// heartbeatStretch is how much longer than HeartbeatInterval each agent
// waits between heartbeats, so that N agents send at most
// MaxHeartbeatsPerSecond: max(1, N / (MaxHeartbeatsPerSecond ×
// HeartbeatInterval)). The liveness thresholds (SuspectAfter, DownAfter)
// stretch by the same factor.
func (s *Server) heartbeatStretch() float64 {
	n := float64(s.rep.nodeCount.Load())
	perNode := s.cfg.MaxHeartbeatsPerSecond * s.cfg.HeartbeatInterval.Seconds() // nodes that fit at the base interval
	if perNode <= 0 || n <= perNode {
		return 1
	}
	return n / perNode
}

// heartbeatInterval is the interval an agent is told to beat at.
func (s *Server) heartbeatInterval() time.Duration {
	return stretch(s.cfg.HeartbeatInterval, s.heartbeatStretch())
}

func stretch(d time.Duration, f float64) time.Duration {
	return time.Duration(math.Round(float64(d) * f))
}

// limit is the tenant's quota as the store re-checks it, when the store
// is shared (nil otherwise: the one process's placement view is exact):
// placement's, the last Reload's if there was one.
func (s *Server) limit(tenant string) *store.Limit {
	if !s.shared() {
		return nil
	}
	qs := s.res.Quotas()
	q, ok := qs.Tenants[tenant]
	if !ok {
		q = qs.Default
	}
	if q == (Quota{}) {
		return nil
	}
	return &store.Limit{Leases: q.Leases, Bytes: q.Bytes, Slots: q.Slots, Bandwidth: q.Bandwidth}
}

// unavailableMessage is what a replica that cannot reach its database
// answers (503), so that clients try another replica.
func unavailableMessage(err error) string {
	return fmt.Sprintf("this control-plane replica cannot reach its database; try another replica (%v)", err)
}
