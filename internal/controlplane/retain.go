package controlplane

import (
	"context"
	"fmt"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// History retention (docs/operations.md, "History retention"): the sweep
// prunes the leases that ended, and the events appended, more than
// Config.RetainHistory ago. What goes is the store's decision
// (store.Pruner.Prune, one write transaction): only ended leases that
// hold nothing (no live part, no open move); a live lease, or one whose
// lenders still tear it down and wipe it (releasing), stays. The sweep
// runs on one replica only (the elected one with a shared store), and a
// lender that still reports a pruned lease is told to tear it down, as
// for any lease the store does not know (lifecycle.Reconcile).

const (
	// pruneBatch is the most leases, and events, one transaction prunes.
	pruneBatch = 1000
	// pruneBatchesPerSweep bounds the work of one sweep; the rest is
	// left to the next ones.
	pruneBatchesPerSweep = 10
	// pruneEvery is how often the sweep looks for history to prune once
	// it has caught up.
	pruneEvery = time.Minute
)

// pruneBefore is the retention rule: history older than the returned
// time goes; the zero time (retain 0: keep for ever) prunes nothing.
func pruneBefore(now time.Time, retain time.Duration) time.Time {
	if retain <= 0 {
		return time.Time{}
	}
	return now.Add(-retain)
}

// pruneHistory is the sweep's retention duty.
func (s *Server) pruneHistory(ctx context.Context, now time.Time) error {
	before := pruneBefore(now, s.cfg.RetainHistory)
	p, ok := s.st.(store.Pruner)
	if before.IsZero() || !ok {
		return nil
	}
	if last := s.lastPrune.Load(); last != 0 && now.Sub(time.Unix(0, last)) < pruneEvery {
		return nil
	}
	var leases, events int
	for range pruneBatchesPerSweep {
		got, err := p.Prune(ctx, before, pruneBatch)
		if err != nil {
			return fmt.Errorf("pruning history: %w", err)
		}
		leases, events = leases+got.Leases, events+got.Events
		if got.Leases < pruneBatch && got.Events < pruneBatch {
			s.lastPrune.Store(now.UnixNano()) // caught up
			break
		}
	}
	if leases > 0 || events > 0 {
		s.log.Info("history pruned", "leases", leases, "events", events, "before", before.Format(time.RFC3339))
	}
	return nil
}

// prunedEvents is the greatest event ID pruned (0: none, or a store that
// does not prune).
func (s *Server) prunedEvents(ctx context.Context) (int64, error) {
	p, ok := s.st.(store.Pruner)
	if !ok {
		return 0, nil
	}
	return p.PrunedEvents(ctx)
}

// checkCursor refuses an event cursor below the pruned events (ErrGone):
// the events after it are no longer all there. 0 is the start of the log
// as kept, never gone.
func (s *Server) checkCursor(ctx context.Context, since int64) error {
	if since <= 0 {
		return nil
	}
	through, err := s.prunedEvents(ctx)
	if err != nil {
		return err
	}
	if since < through {
		return goneError(since, through)
	}
	return nil
}

func goneError(since, through int64) error {
	return fmt.Errorf("%w: the events after %d were pruned up to %d (history retention); resume from since=%d, or 0 for the oldest event kept", ErrGone, since, through, through)
}
