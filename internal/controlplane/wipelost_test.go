package controlplane

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// lostRangeEnv is a control plane with a fake clock, on a store of the
// test's choosing (SQLite: the marks of ranges being wiped in memory;
// PostgreSQL: in the store too), and one real agent lending a block
// device of 64 MiB, which can be killed and started again on its state
// directory.
type lostRangeEnv struct {
	*testAgent
	t        *testing.T
	deadline time.Time
	st       store.Store
	srv      *Server
	clk      *clock.FakeNow
	url      string
}

func newLostRangeEnv(t *testing.T, pg bool) *lostRangeEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	var st store.Store
	if pg {
		st = openPG(ctx, t, pgtest.DB(t), 4)
	} else {
		s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "rialto.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		st = s
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clk := clock.NewFakeNow(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	srv := runServer(ctx, t, Config{Store: st, Logger: log, Clock: clk, BootstrapToken: bootTok,
		Tokens:         []Token{{Token: aliceTok, Tenant: "alice"}, {Token: bobTok, Tenant: "bob"}, {Token: adminTok, Tenant: "admin", Admin: true}},
		PrepareTimeout: 10 * time.Second, HeartbeatInterval: 100 * time.Millisecond, SuspectAfter: 10 * time.Minute, DownAfter: 20 * time.Minute})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	acfg := diskAgentConfig(t, ts.URL, log)
	acfg.Clock = clk
	return &lostRangeEnv{testAgent: newTestAgent(t, acfg), t: t, deadline: time.Now().Add(2 * time.Minute), st: st, srv: srv, clk: clk, url: ts.URL}
}

// ctx is the test's context, ended when the test ends or 2 minutes after
// the env was made.
func (e *lostRangeEnv) ctx() context.Context {
	ctx, cancel := context.WithDeadline(e.t.Context(), e.deadline)
	e.t.Cleanup(cancel)
	return ctx
}

// until polls cond every 5 ms until it holds, failing the test with msg
// at the test's deadline or when the agent stops.
func (e *lostRangeEnv) until(msg string, cond func() bool) {
	e.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond) // polling with the test's deadline
	defer tick.Stop()
	for {
		if e.ctx().Err() != nil { // a cond that reads the store would fail with the context's error
			e.t.Fatal(msg)
		}
		if cond() {
			return
		}
		select {
		case <-tick.C:
		case err := <-e.done: // the agent ended: nothing it was to do comes
			e.done <- err
			e.t.Fatalf("%s: the agent stopped: %v", msg, err)
		case <-e.ctx().Done():
			e.t.Fatal(msg)
		}
	}
}

// marked reports whether lease id's ranges on node are marked as being
// wiped: in the store, which every replica's view loads, when it is
// shared; in the placement view otherwise.
func (e *lostRangeEnv) marked(id, node string) bool {
	e.t.Helper()
	w, ok := e.srv.wiper()
	if !ok {
		return e.srv.res.marked(id, node)
	}
	ws, err := w.Wipes(e.ctx())
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.ContainsFunc(ws, func(w store.Wipe) bool { return w.LeaseID == id && w.NodeID == node })
}

// secret is what the first tenant writes.
var secret = []byte("the first tenant's bytes")

// writeAt writes b at off through a block lease's URI and flushes it.
func (e *lostRangeEnv) writeAt(uri string, b []byte, off int64) {
	e.t.Helper()
	vol, err := nbd.DialURI(e.ctx(), uri)
	if err != nil {
		e.t.Fatal(err)
	}
	defer vol.Close()
	if _, err := vol.WriteAt(b, off); err != nil {
		e.t.Fatal(err)
	}
	if err := vol.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

// readAt reads n bytes at off through a block lease's URI.
func (e *lostRangeEnv) readAt(uri string, n int, off int64) []byte {
	e.t.Helper()
	vol, err := nbd.DialURI(e.ctx(), uri)
	if err != nil {
		e.t.Fatal(err)
	}
	defer vol.Close()
	b := make([]byte, n)
	if _, err := vol.ReadAt(b, off); err != nil {
		e.t.Fatal(err)
	}
	return b
}

// onEachStore runs f, in parallel, on a lostRangeEnv of each store:
// SQLite and PostgreSQL.
func onEachStore(t *testing.T, f func(t *testing.T, e *lostRangeEnv)) {
	for _, pg := range []bool{false, true} {
		name := "sqlite"
		if pg {
			name = "postgres"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, newLostRangeEnv(t, pg))
		})
	}
}

// leased launches the lender and leases alice a MiB of its device.
func (e *lostRangeEnv) leased() api.Lease {
	e.t.Helper()
	e.launch(nil)
	e.waitReady()
	alice := api.NewClient(e.url, aliceTok, nil)
	l, err := alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil || l.State != api.LeaseActive {
		e.t.Fatalf("lease: %+v %v", l, err)
	}
	return l
}

// placedBeside leases bob a MiB while the device's first MiB holds a lost
// lease's unwiped bytes: the lease, failing with msg if it is refused, is
// placed beside that range and reads zeroes.
func (e *lostRangeEnv) placedBeside(msg string) {
	e.t.Helper()
	bob := api.NewClient(e.url, bobTok, nil)
	l, err := bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		e.t.Fatalf("%s: %v", msg, err)
	}
	if p := l.Parts[0]; p.Offset < 1<<20 {
		e.t.Fatalf("the new lease is at offset %d, over the lost lease's unwiped range", p.Offset)
	}
	if got := e.readAt(l.URI, len(secret), 0); !bytes.Equal(got, make([]byte, len(secret))) {
		e.t.Fatalf("the new lease reads %q", got)
	}
}

// lostWhileDown leases the first MiB of the device to alice, who writes
// secret at its start, kills the lender and lets its node go down: the
// lease is lost, its range left unwiped on the lender (its exports file
// keeps the export). It returns the lease as lost.
func (e *lostRangeEnv) lostWhileDown() api.Lease {
	e.t.Helper()
	l := e.leased()
	if l.Parts[0].Offset != 0 {
		e.t.Fatalf("the first lease is at offset %d of its device, want 0", l.Parts[0].Offset)
	}
	e.writeAt(l.URI, secret, 0)
	e.kill()
	// A heartbeat the agent sent before it was killed may still be in
	// the server's hands, and be recorded at the time the clock shows
	// after the advance: the clock moves on again until the sweep finds
	// the node silent past DownAfter.
	var got api.Lease
	e.until("the lease of a node gone down is not lost", func() bool {
		e.clk.Advance(e.srv.cfg.DownAfter + time.Minute)
		if err := e.srv.Sweep(e.ctx()); err != nil {
			e.t.Fatal(err)
		}
		var err error
		if got, err = e.st.Lease(e.ctx(), l.ID); err != nil {
			e.t.Fatal(err)
		}
		return got.State == api.LeaseLost
	})
	return got
}

// TestLostRangeMarkedUntilWiped: a block lease lost with its lender's node
// (down) leaves its range holding the tenant's bytes on the lender, which
// wipes it only once a heartbeat answer tells it to tear the lost lease
// down. The range stays marked as being wiped until then: when the lender
// comes back (here it has joined, its heartbeats not yet sent) a new lease
// is placed around the range, not refused there, and once the lender
// confirmed the wipe the range is lent again, reading zeroes. The range
// was marked for no one: placement chose it for the next lease at once,
// whose prepare the lender refused (it still served the lost lease's
// export there), and with no other room the lease failed.
func TestLostRangeMarkedUntilWiped(t *testing.T) {
	onEachStore(t, func(t *testing.T, e *lostRangeEnv) {
		lost := e.lostWhileDown()
		node := lost.Parts[0].NodeID
		if !e.marked(lost.ID, node) {
			t.Error("the range of a lease lost with its node is not marked as being wiped")
		}

		// The lender comes back: it joins again, serving nothing yet
		// (the lost lease's export is held), and does not heartbeat.
		e.launch(func(a *agent.Agent) { a.Faults.PauseHeartbeats.Store(true) })
		e.waitReady()
		e.placedBeside("a lease placed while a lost lease's range is not wiped yet failed")

		e.wipedThenLentAgain(lost)
	})
}

// wipedThenLentAgain lets the lender, which came back with its heartbeats
// paused, heartbeat again: their answers tell it to tear the lost lease
// down, and once it confirmed the wipe the lost lease's range (the
// device's first MiB) is lent again and reads zeroes.
func (e *lostRangeEnv) wipedThenLentAgain(lost api.Lease) {
	e.t.Helper()
	node := lost.Parts[0].NodeID
	e.agent.PauseHeartbeats(false)
	e.until("the lender never tore the lost lease down", func() bool { return !slices.Contains(e.agent.Leases(), lost.ID) })
	// (A shared store forgets a mark on a heartbeat that comes settle
	// after the answer that told the lender.)
	e.clk.Advance(e.srv.cfg.PrepareTimeout + e.srv.cfg.HeartbeatInterval + time.Second)
	e.until("the mark of the lost lease's range never went", func() bool {
		if err := e.srv.Sweep(e.ctx()); err != nil {
			e.t.Fatal(err)
		}
		return !e.marked(lost.ID, node)
	})
	bob := api.NewClient(e.url, bobTok, nil)
	l, err := bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		e.t.Fatal(err)
	}
	if l.Parts[0].Offset != 0 {
		e.t.Fatalf("the lease made after the wipe is at offset %d, want the wiped range at 0", l.Parts[0].Offset)
	}
	if got := e.readAt(l.URI, len(secret), 0); !bytes.Equal(got, make([]byte, len(secret))) {
		e.t.Fatalf("the next tenant of the lost lease's range reads %q", got)
	}
}

// TestStillServedRangePlacedAround: a lender that refuses a range because
// it still serves it for another lease (a lost one, not torn down yet
// there, whose range the control plane has no mark for: here the node was
// removed while down, and its agent joined again, before its first
// heartbeat) is not skipped: the lease is placed around the range, as
// around one it is still wiping. The refusal skipped the lender, and with
// no other the lease failed.
func TestStillServedRangePlacedAround(t *testing.T) {
	onEachStore(t, func(t *testing.T, e *lostRangeEnv) {
		lost := e.lostWhileDown()
		node := lost.Parts[0].NodeID
		admin := api.NewClient(e.url, adminTok, nil)
		if _, err := admin.RemoveNode(e.ctx(), node, false); err != nil {
			t.Fatal(err)
		}
		e.launch(func(a *agent.Agent) { a.Faults.PauseHeartbeats.Store(true) })
		e.waitReady()
		if n, err := e.st.Node(e.ctx(), node); err != nil || n.State != api.NodeReady {
			t.Fatalf("the removed node after its agent joined again: %+v %v", n.Node, err)
		}
		if e.marked(lost.ID, node) {
			t.Fatal("the lost lease's range on the removed node is still marked")
		}
		e.placedBeside("a lease refused a range its lender still serves for a lost lease failed")
		e.wipedThenLentAgain(lost)
	})
}

// TestStillServedAccelSlotPlacedAround: a lender's refusal of an accel
// slot it still serves for a lost lease (the lender was down; an accel
// lease lost with it leaves no mark, and its agent, back, holds the
// export) marks that slot, a mark of the refused lease's kind (accel,
// not block: wipesOf marks refused ranges of any kind), and the lease is
// placed on another slot of the device, not skipping the lender.
func TestStillServedAccelSlotPlacedAround(t *testing.T) {
	onEachStore(t, func(t *testing.T, e *lostRangeEnv) {
		e.cfg.Devices = append(e.cfg.Devices, agent.DeviceConfig{Name: "fpga0", Kind: api.KindAccel, Size: 4,
			Attributes: map[string]string{"slot_memory": "1MiB"}})
		e.launch(nil)
		e.waitReady()
		alice := api.NewClient(e.url, aliceTok, nil)
		l, err := alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel})
		if err != nil || l.State != api.LeaseActive || l.Mode != api.ModeDedicated || len(l.Parts) != 1 ||
			l.Parts[0].Offset != 0 || l.Parts[0].Length != api.SlotUnits {
			t.Fatalf("the first accel lease, want the device's first slot, dedicated: %v %+v", err, l)
		}
		node := l.Parts[0].NodeID
		e.kill()
		e.until("the lease of a node gone down is not lost", func() bool {
			e.clk.Advance(e.srv.cfg.DownAfter + time.Minute)
			if err := e.srv.Sweep(e.ctx()); err != nil {
				t.Fatal(err)
			}
			got, err := e.st.Lease(e.ctx(), l.ID)
			if err != nil {
				t.Fatal(err)
			}
			return got.State == api.LeaseLost
		})
		// Back, holding the lost lease's export, its heartbeats (whose
		// answers would tell it to tear it down) paused.
		e.launch(func(a *agent.Agent) { a.Faults.PauseHeartbeats.Store(true) })
		e.waitReady()
		if !slices.Contains(e.agent.Leases(), l.ID) {
			t.Fatal("the lender came back without the lost lease's export")
		}
		bob := api.NewClient(e.url, bobTok, nil)
		b, err := bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel})
		if err != nil {
			t.Fatalf("an accel lease beside the slot its lender still serves for a lost lease: %v", err)
		}
		if p := b.Parts[0]; p.NodeID != node || p.Offset < api.SlotUnits {
			t.Fatalf("the new lease's part %+v, want another slot of the device", p)
		}
		if !e.marked(refusedPrefix+b.ID+"/"+l.Parts[0].DeviceID+"/0", node) {
			t.Fatal("the refused slot is not marked")
		}
	})
}

// TestRefusedAccelSlotHoldsItsSlot: the mark of an accel slot a lender
// refused to a dedicated lease (still served for another lease), made
// while the placement view is loaded (another request reloaded it since
// the failed prepare freed the lease's parts), holds that slot only, as
// the view reads it once loaded again: a lease is placed on another slot
// of the device. It was entered as a block range of a dedicated lease,
// which holds its whole device: the lease waited for a wipe (WipeWait),
// then failed.
func TestRefusedAccelSlotHoldsItsSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.WipeWait = 50 * time.Millisecond })
	node := e.joinSpecs("n1", nil, api.DeviceSpec{Name: "fpga0", Kind: api.KindAccel, Capacity: 4, Sharing: "partitionable"})
	// A lease placed: the view is loaded, its placement index built.
	first, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel})
	if err != nil || first.Mode != api.ModeDedicated || first.Parts[0].Offset != 0 {
		t.Fatalf("the first accel lease, want the first slot, dedicated: %v %+v", err, first)
	}
	refused := api.Part{NodeID: node, DeviceID: first.Parts[0].DeviceID, Offset: api.SlotUnits, Length: api.SlotUnits}
	e.srv.refusedWiping(e.ctx(), api.Lease{ID: "lease-refused", Kind: api.KindAccel, Mode: api.ModeDedicated}, refused)
	l, err := e.bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel})
	if err != nil {
		t.Fatalf("an accel lease beside a refused slot: %v", err)
	}
	if p := l.Parts[0]; p.Offset < 2*api.SlotUnits {
		t.Fatalf("the lease's part %+v is on a slot taken or refused", p)
	}
}
