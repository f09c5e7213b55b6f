package controlplane

import (
	"context"
	"log/slog"
	"slices"
	"strings"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// apply steps lease l with event ev (lifecycle.Step) and performs what
// the step asks for, in order: its write through the group commit (the
// store re-checks the lease's state, and a reservation's capacity),
// teardowns on the lenders, and the reserver's Commit or Release of the
// placement a write holds or a lease's end frees. It returns the lease as
// stored after the step, and the actions it leaves to its caller: Prepare
// and Place, which the reservation pipeline answers with the next event,
// and TeardownOn and KeepOn, which a heartbeat answers.
//
// A refused or failed write ends the step: apply performs the write's
// Undo, and returns the lease as it was and the store's error. An event
// the machine refuses comes back as its error (lifecycle.ErrRefused),
// after the actions it still asks for.
func (s *Server) apply(ctx context.Context, l api.Lease, ev lifecycle.Event) (api.Lease, []lifecycle.Action, error) {
	next, acts, err := lifecycle.Step(l, ev, s.now())
	var rest []lifecycle.Action
	wipes := slices.ContainsFunc(acts, func(a lifecycle.Action) bool {
		t, ok := a.(lifecycle.Teardown)
		return ok && t.Placement == 0
	})
	for _, a := range acts {
		if _, ok := a.(lifecycle.Free); ok && wipes {
			// A teardown follows: the lease's ranges stay out of
			// placement (being wiped) from before it leaves the view.
			s.markWiping(ctx, next, teardownUnmarked(acts))
			wipes = false
		}
		var out api.Lease
		var werr error
		switch a := a.(type) {
		case lifecycle.Create:
			out, werr = s.leases.do(ctx, s.st, store.LeaseOp{Create: &store.NewLease{Lease: next, Demand: a.Demand, Idem: a.Idem, Event: a.Event, Limit: s.limit(next.Tenant)}})
			s.settle(next.ID, werr)
			s.wrote(ctx, l, out, a.Event, werr)
		case lifecycle.Replace:
			out, werr = s.st.ReplaceParts(ctx, l.ID, a.Plan.Parts, &a.Plan, a.Event.At, a.Event)
			s.settle(l.ID, werr)
			s.wrote(ctx, l, out, a.Event, werr)
		case lifecycle.Persist:
			out, werr = s.leases.do(ctx, s.st, store.LeaseOp{Transition: store.Transition{ID: l.ID, Change: a.Change, Event: a.Event}})
			s.wrote(ctx, l, out, a.Event, werr)
			if werr != nil {
				s.effects(ctx, l, a.Undo...)
			}
		case lifecycle.BeginMove:
			werr = s.beginMove(ctx, a)
			out = next
		case lifecycle.FinishMove:
			out, werr = s.finishMove(ctx, l, a)
			if werr != nil {
				rest = append(rest, s.effects(ctx, l, a.Undo...)...)
				return l, rest, werr
			}
		case lifecycle.EndMove:
			s.endMove(ctx, a)
			continue
		case lifecycle.AdoptPart:
			out, werr = s.adoptPart(ctx, a)
		default:
			rest = append(rest, s.effects(ctx, next, a)...)
			continue
		}
		if werr != nil {
			return l, nil, werr
		}
		next = out
	}
	return next, rest, err
}

// effects performs the actions that are not writes (Teardown, Free) for
// lease l, and returns the others.
func (s *Server) effects(ctx context.Context, l api.Lease, acts ...lifecycle.Action) []lifecycle.Action {
	var rest []lifecycle.Action
	for _, a := range acts {
		switch a := a.(type) {
		case lifecycle.Teardown:
			if a.Placement == 0 {
				// The lenders wipe the lease's block ranges: they stay
				// out of placement until a lender confirms (wiping.go),
				// those of a lender not told now (Except) too.
				s.markWiping(ctx, l, unmarked(a))
			}
			s.teardownParts(ctx, l, a.Placement, a.Except)
		case lifecycle.Free:
			s.res.Release(l.ID)
		case lifecycle.FreeParts:
			s.res.Invalidate() // the store freed them: the view reloads without them
		case lifecycle.EndMove:
			s.endMove(ctx, a)
		default:
			rest = append(rest, a)
		}
	}
	return rest
}

// teardownUnmarked is the node whose ranges the full teardown among acts
// leaves unmarked (unmarked).
func teardownUnmarked(acts []lifecycle.Action) string {
	for _, a := range acts {
		if t, ok := a.(lifecycle.Teardown); ok && t.Placement == 0 {
			return unmarked(t)
		}
	}
	return ""
}

// unmarked is the node whose block ranges teardown t leaves unmarked as
// being wiped: a removed node left out of it, whose ranges left the pool
// with it ("" for none). A node left out because it is down, or lost the
// lease's exports, still holds the lease's bytes: its ranges are marked
// until it confirms their wipe (its heartbeats, once an answer told it).
func unmarked(t lifecycle.Teardown) string {
	if t.Removed {
		return t.Except
	}
	return ""
}

// settle tells the reserver the outcome of the write of a placement it
// holds.
func (s *Server) settle(id string, err error) {
	if err != nil {
		s.res.Release(id)
		return
	}
	s.res.Commit(id)
}

// wrote counts and logs a lease write that succeeded: a transition to a
// state (renewals included) is counted; a change of state, a re-placement
// or a moved export is logged.
func (s *Server) wrote(ctx context.Context, prev, l api.Lease, ev api.Event, err error) {
	if err != nil {
		return
	}
	transition := ev.Type == "lease."+string(l.State)
	if transition {
		s.m.leaseTransitions.WithLabelValues(string(l.State)).Inc()
	}
	if transition && prev.State == l.State {
		return // a renewal
	}
	level := slog.LevelInfo
	if l.State == api.LeaseFailed || l.State == api.LeaseLost || ev.Type == "lease.part.lost" {
		level = slog.LevelWarn
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	args := []any{"lease", l.ID, "tenant", l.Tenant}
	switch {
	case ev.Type == "lease.part.lost":
		args = append(args, "what", ev.Message)
	case level == slog.LevelWarn:
		args = append(args, "reason", l.Reason)
	}
	s.log.Log(ctx, level, strings.ReplaceAll(ev.Type, ".", " "), args...)
}
