package controlplane

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
)

// releasedUnreachable leases a block range, kills its lender and releases
// the lease: the teardown does not reach the lender, which keeps the
// tenant's export (its exports file), and the range stays marked as being
// wiped. The clock then passes the marks' settling time.
func (e *lostRangeEnv) releasedUnreachable() api.Lease {
	e.t.Helper()
	l := e.leased()
	e.kill()
	alice := api.NewClient(e.url, aliceTok, nil)
	if _, err := alice.ReleaseLease(e.ctx(), l.ID); err != nil {
		e.t.Fatal(err)
	}
	if !e.marked(l.ID, l.Parts[0].NodeID) {
		e.t.Fatalf("the released lease's range, its lender unreachable, is not marked as being wiped")
	}
	e.clk.Advance(e.srv.cfg.PrepareTimeout + e.srv.cfg.HeartbeatInterval + time.Second)
	return l
}

// TestWipeMarkHeldWhileLenderServes: a range whose lender missed the
// teardown (unreachable at the release) stays marked as being wiped when
// the lender comes back still serving the ended lease. Its heartbeat lists
// the lease as served, not as being wiped, and its answer tells it to tear
// the lease down (its wipe starts then): the sweep forgot the mark on that
// heartbeat, so the store and every replica took the range, still holding
// the tenant's bytes, for free.
func TestWipeMarkHeldWhileLenderServes(t *testing.T) {
	t.Parallel()
	e := newLostRangeEnv(t, true)
	l := e.releasedUnreachable()

	started, finish := make(chan string, 1), make(chan struct{})
	hook := func(ctx context.Context, id string) {
		select {
		case started <- id:
		default:
		}
		select {
		case <-finish:
		case <-ctx.Done():
		}
	}
	e.launch(func(a *agent.Agent) { a.Faults.BeforeWipe.Store(&hook) })
	var once sync.Once
	done := func() { once.Do(func() { close(finish) }) }
	t.Cleanup(done) // before kill (cleanups run last-in first-out)
	// The agent is ready once it has applied its first heartbeat's
	// answer: the teardown, whose wipe waits.
	select {
	case id := <-started:
		if id != l.ID {
			t.Fatalf("the lender wipes %s, want %s", id, l.ID)
		}
	case <-e.ctx().Done():
		t.Fatal("the lender, told by its heartbeat's answer, did not start wiping the released lease")
	}
	// The heartbeat that listed the lease as served was recorded before
	// its answer; the lender is wiping now.
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if !e.marked(l.ID, l.Parts[0].NodeID) {
		t.Fatal("the sweep forgot the mark of a range whose lender still served the ended lease, and is wiping it now")
	}

	// The wipe done, the mark goes on the lender's heartbeats once they
	// come settle after the answer.
	done()
	e.waitReady()
	e.clk.Advance(e.srv.cfg.PrepareTimeout + e.srv.cfg.HeartbeatInterval + time.Second)
	e.until("the mark of a wiped range never went", func() bool { return !e.marked(l.ID, l.Parts[0].NodeID) })
}

// TestWipeMarkHeldAcrossRejoin: a rejoin is not a heartbeat listing the
// lender's wipes: a lender that comes back after missing a teardown and
// has not yet heartbeat keeps its ranges marked as being wiped. The join
// recorded the node as heard from, with the wipes of its last heartbeat
// before (none), and the sweep forgot the marks on that.
func TestWipeMarkHeldAcrossRejoin(t *testing.T) {
	t.Parallel()
	e := newLostRangeEnv(t, true)
	l := e.releasedUnreachable()

	node := l.Parts[0].NodeID
	hold := make(chan struct{})
	e.launch(func(a *agent.Agent) { a.Faults.HoldJoinAnswer.Store(&hold) })
	t.Cleanup(func() { close(hold) }) // before kill
	// The join is answered (and its answer held by the agent) once the
	// node is recorded as heard from again.
	e.until("the lender did not join again", func() bool {
		n, err := e.st.Node(e.ctx(), node)
		if err != nil {
			t.Fatal(err)
		}
		return !n.LastHeartbeat.Before(e.clk.Now())
	})
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if !e.marked(l.ID, l.Parts[0].NodeID) {
		t.Fatal("the sweep forgot the mark of a range of a lender that rejoined and has not listed its wipes yet")
	}
}

// TestRemovedNodeWipeMarksGo: the marks of ranges being wiped on a node
// that is removed go with it. No heartbeat of it is recorded again (a
// removed node's are refused), so the sweep never forgot them: they stayed
// in the store for good, each replica's view kept a wipe pending (every
// placement that found no room weighed waiting for it), and the sweep's
// every pass read them again.
func TestRemovedNodeWipeMarksGo(t *testing.T) {
	t.Parallel()
	e := newLostRangeEnv(t, true)
	l := e.releasedUnreachable()
	node := l.Parts[0].NodeID
	e.clk.Advance(e.srv.cfg.DownAfter + time.Minute)
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	admin := api.NewClient(e.url, adminTok, nil)
	if _, err := admin.RemoveNode(e.ctx(), node, false); err != nil {
		t.Fatal(err)
	}
	if e.marked(l.ID, l.Parts[0].NodeID) {
		t.Fatal("the marks of ranges being wiped on a removed node stay")
	}
	if _, pending := e.srv.res.wipesPending(e.ctx()); pending {
		t.Fatal("the control plane still waits for wipes on a removed node")
	}
}
