package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
)

// beater is a node of an env whose heartbeats the test makes: with
// complete lists, by part (api.Heartbeat.ExportsComplete) unless old, each
// sending back the check of the answer before.
type beater struct {
	t     *testing.T
	e     *env
	id    string
	c     *api.Client
	check string
	old   bool // an agent older than the lists by part
}

func (e *env) beater(name string, sizes ...int64) *beater {
	e.t.Helper()
	j, c := e.join(name, sizes...)
	return &beater{t: e.t, e: e, id: j.NodeID, c: c}
}

// beat sends a heartbeat listing xs (their leases in Leases) and returns
// the answer.
func (n *beater) beat(xs ...api.ServedExport) api.HeartbeatResponse {
	n.t.Helper()
	h := api.Heartbeat{Health: "ok", LeasesComplete: true, Check: n.check, ExportsComplete: !n.old}
	for _, x := range xs {
		if !slices.Contains(h.Leases, x.LeaseID) {
			h.Leases = append(h.Leases, x.LeaseID)
		}
		if !n.old {
			h.Exports = append(h.Exports, x)
		}
	}
	r, err := n.c.Heartbeat(n.e.ctx(), n.id, h)
	if err != nil {
		n.t.Fatal(err)
	}
	if r.Check != "" {
		n.check = r.Check
	}
	return r
}

// device is the ID of the node's device name.
func (n *beater) device(name string) string {
	n.t.Helper()
	ds, err := n.e.srv.st.Devices(n.e.ctx())
	if err != nil {
		n.t.Fatal(err)
	}
	for _, d := range ds {
		if d.NodeID == n.id && d.Name == name {
			return d.ID
		}
	}
	n.t.Fatalf("node %s has no device %s", n.id, name)
	return ""
}

// served is the export of part i of lease l as its lender lists it (one
// it prepared: no move, no URI).
func served(l api.Lease, i int) api.ServedExport {
	p := l.Parts[i]
	return api.ServedExport{LeaseID: l.ID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length}
}

// movedHere is the export of part i of lease l that a move the store does
// not know (move) brought to device dev of a node, at off.
func movedHere(l api.Lease, i int, move, dev string, off int64) api.ServedExport {
	return api.ServedExport{LeaseID: l.ID, DeviceID: dev, Offset: off, Length: l.Parts[i].Length, Move: move,
		URI: "nbd://127.0.0.2:10809/" + movedExport(l.Credential, i, move)}
}

func (e *env) lease(id string) api.Lease {
	e.t.Helper()
	l, err := e.alice.Lease(e.ctx(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

func tearsDown(r api.HeartbeatResponse, id string) bool { return slices.Contains(r.Teardown, id) }

func keeps(r api.HeartbeatResponse, id string) (api.LeaseExpiry, bool) {
	i := slices.IndexFunc(r.Leases, func(x api.LeaseExpiry) bool { return x.ID == id })
	if i < 0 {
		return api.LeaseExpiry{}, false
	}
	return r.Leases[i], true
}

// blockLease is a 1 MiB block lease c creates on lender n.
func (e *env) blockLease(c *api.Client, n *beater) api.Lease {
	e.t.Helper()
	l, err := c.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: []string{n.id}})
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

// lenders is an env with two lenders, n1 and n2, and alice's lease l on
// n1.
func lenders(t *testing.T) (e *env, n1, n2 *beater, l api.Lease) {
	t.Helper()
	e = newEnv(t)
	n1, n2 = e.beater("n1", 1<<30), e.beater("n2", 1<<30)
	return e, n1, n2, e.blockLease(e.alice, n1)
}

// contest has holder list xs, and then lender list nothing, rounds times,
// and reports whether holder was ever told to tear lease id down.
func contest(holder, lender *beater, id string, rounds int, xs ...api.ServedExport) (told bool) {
	for range rounds {
		if tearsDown(holder.beat(xs...), id) {
			told = true
		}
		lender.beat()
	}
	return told
}

// notAdopted fails the test unless holder's copy of lease id's part was
// not adopted, holder was told to tear it down, and the part its lender
// does not serve was lost.
func (e *env) notAdopted(id string, holder *beater, told bool) {
	e.t.Helper()
	got := e.lease(id)
	if got.Parts[0].NodeID == holder.id {
		e.t.Fatalf("the copy on %s was adopted, at %q: %s (%q)", holder.id, got.URI, got.State, got.Reason)
	}
	if !told {
		e.t.Fatalf("%s was never told to tear its copy down", holder.id)
	}
	if got.State != api.LeaseLost {
		e.t.Fatalf("the part its lender does not serve: %s (%q)", got.State, got.Reason)
	}
}

// TestUnservedPartAdopted: an active lease's part is recorded on n1,
// which does not serve it; n2 serves it (a move the restored database does
// not know brought it there), under the name the control plane derives
// for the part and that move. n2 is not told to tear the export down, nor
// to serve it: it is left as it is. n1's checked heartbeats do not list
// the part: while n2 was not heard yet the part waits (a lender not heard
// may hold it); once n2 lists it, the part is adopted there (the range n2
// serves, n2's URI; a move recorded done; event lease.part.adopted), and
// n2's next answer keeps it.
func TestUnservedPartAdopted(t *testing.T) {
	t.Parallel()
	e, n1, n2, l := lenders(t)
	n1.beat()
	n1.beat()
	if got := e.lease(l.ID); got.State != api.LeaseActive || got.Parts[0].NodeID != n1.id {
		t.Fatalf("lost (or adopted) before n2, which may hold it, was heard: %s on %s (%q)", got.State, got.Parts[0].NodeID, got.Reason)
	}
	x := movedHere(l, 0, "move-after-the-backup", n2.device("disk0"), 4<<20)
	r := n2.beat(x)
	if tearsDown(r, l.ID) {
		t.Fatal("n2 was told to tear down the only copy of the part")
	}
	if k, ok := keeps(r, l.ID); ok {
		t.Fatalf("n2 was told to serve the part the store does not place there: %+v", k)
	}
	n1.beat()
	got := e.lease(l.ID)
	p := got.Parts[0]
	if got.State != api.LeaseActive || p.NodeID != n2.id || p.DeviceID != x.DeviceID || p.Offset != x.Offset || p.Length != x.Length || p.URI != x.URI || got.URI != x.URI {
		t.Fatalf("after n1's heartbeats: %s (%q), part on %s device %s [%d+%d]", got.State, got.Reason, p.NodeID, p.DeviceID, p.Offset, p.Length)
	}
	r = n2.beat(x)
	if k, ok := keeps(r, l.ID); tearsDown(r, l.ID) || !ok || len(k.Parts) != 1 || k.Parts[0] != (api.PartRef{DeviceID: x.DeviceID, Offset: x.Offset, Length: x.Length}) {
		t.Fatalf("n2's answer after the adoption: teardown %v, leases %+v", r.Teardown, r.Leases)
	}
	ms, err := e.alice.Moves(e.ctx(), l.ID)
	if err != nil || len(ms) != 1 || ms[0].State != api.MoveDone || ms[0].From.NodeID != n1.id || ms[0].To.NodeID != n2.id {
		t.Fatalf("the lease's moves: %+v %v", ms, err)
	}
	evs, err := e.alice.Events(e.ctx(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(ev api.Event) bool {
		return ev.Type == "lease.part.adopted" && ev.Subject == l.ID && strings.Contains(ev.Message, n1.id) && strings.Contains(ev.Message, n2.id)
	}) {
		t.Fatal("no lease.part.adopted event naming both lenders")
	}
}

// gate stops a store call, once armed, until resume is closed, closing
// reached when it does.
type gate struct {
	armed   atomic.Bool
	reached chan struct{}
	resume  chan struct{}
}

func newGate() *gate { return &gate{reached: make(chan struct{}), resume: make(chan struct{})} }

func (g *gate) pass(ctx context.Context) {
	if g.armed.CompareAndSwap(true, false) {
		close(g.reached)
		select {
		case <-g.resume:
		case <-ctx.Done():
		}
	}
}

// pausingStore is a SQLite store whose reading of lease pause's leases by
// ID (a heartbeat's, api.Heartbeat.Leases) stops after the read at gate
// read, and whose adoptions stop after their commit at gate adopted.
type pausingStore struct {
	*sqlite.Store
	pause         string
	read, adopted *gate
}

func (p *pausingStore) Leases(ctx context.Context, f store.LeaseFilter) ([]api.Lease, error) {
	ls, err := p.Store.Leases(ctx, f)
	if slices.Equal(f.IDs, []string{p.pause}) {
		p.read.pass(ctx)
	}
	return ls, err
}

func (p *pausingStore) AdoptPart(ctx context.Context, m api.Move, uri string, ev api.Event) (api.Lease, error) {
	l, err := p.Store.AdoptPart(ctx, m, uri, ev)
	p.adopted.pass(ctx)
	return l, err
}

// TestUnservedAnswerReadBeforeAnAdoption: n2 holds the copy of a part the
// store places on n1, which does not serve it, and is left in doubt. n2's
// next heartbeat reads the lease, the part still on n1; before it
// answers, n1's checked heartbeat adopts n2's copy: all of n1's check
// done (its result known), or only the adoption committed (the move it
// records as done readable). The answer made then, from the lease as read
// (the part on n1) and the check or the move (the copy adopted, or a
// stale one from a move the part left since), does not have n2 tear the
// copy down (nor drop it): it is decided from the lease read again. n2's
// next answer keeps it, adopted.
func TestUnservedAnswerReadBeforeAnAdoption(t *testing.T) {
	t.Parallel()
	for _, whole := range []bool{true, false} {
		name := "check done"
		if !whole {
			name = "adoption committed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ps := &pausingStore{read: newGate(), adopted: newGate()}
			e := newEnv(t, func(c *Config) {
				ps.Store = c.Store.(*sqlite.Store)
				c.Store = ps
			})
			n1, n2 := e.beater("n1", 1<<30), e.beater("n2", 1<<30)
			l := e.blockLease(e.alice, n1)
			ps.pause = l.ID
			n1.beat()
			n1.beat()
			x := movedHere(l, 0, "move-after-the-backup", n2.device("disk0"), 4<<20)
			if r := n2.beat(x); tearsDown(r, l.ID) {
				t.Fatal("n2 was told to tear down the only copy of the part")
			}

			type answer struct {
				r   api.HeartbeatResponse
				err error
			}
			answered, checked := make(chan answer, 1), make(chan answer, 1)
			ps.read.armed.Store(true)
			go func() {
				r, err := n2.c.Heartbeat(e.ctx(), n2.id, api.Heartbeat{Health: "ok", LeasesComplete: true, ExportsComplete: true, Check: n2.check,
					Leases: []string{l.ID}, Exports: []api.ServedExport{x}})
				answered <- answer{r, err}
			}()
			<-ps.read.reached // n2's heartbeat read the lease, on n1
			if whole {
				n1.beat() // adopts n2's copy
			} else {
				ps.adopted.armed.Store(true)
				go func() {
					r, err := n1.c.Heartbeat(e.ctx(), n1.id, api.Heartbeat{Health: "ok", LeasesComplete: true, ExportsComplete: true, Check: n1.check})
					checked <- answer{r, err}
				}()
				<-ps.adopted.reached // n1's check adopted n2's copy, and goes on after n2's answer
			}
			if got := e.lease(l.ID); got.Parts[0].NodeID != n2.id {
				t.Fatalf("n1's check did not adopt n2's copy: %s on %s (%q)", got.State, got.Parts[0].NodeID, got.Reason)
			}
			close(ps.read.resume)
			a := <-answered
			if a.err != nil {
				t.Fatal(a.err)
			}
			if !whole {
				close(ps.adopted.resume)
				if c := <-checked; c.err != nil {
					t.Fatal(c.err)
				}
			}
			ref := api.PartRef{DeviceID: x.DeviceID, Offset: x.Offset, Length: x.Length}
			if tearsDown(a.r, l.ID) {
				t.Fatal("the answer to the heartbeat that read the lease before the adoption has n2 tear down the copy adopted meanwhile")
			}
			if k, ok := keeps(a.r, l.ID); ok && !slices.Contains(k.Parts, ref) && !slices.Contains(k.Doubt, ref) {
				t.Fatalf("the answer to the heartbeat that read the lease before the adoption has n2 drop the copy adopted meanwhile: %+v", k)
			}
			if a.r.Check != "" {
				n2.check = a.r.Check
			}
			r := n2.beat(x)
			if k, ok := keeps(r, l.ID); tearsDown(r, l.ID) || !ok || !slices.Equal(k.Parts, []api.PartRef{ref}) {
				t.Fatalf("n2's answer after the adoption: teardown %v, leases %+v", r.Teardown, r.Leases)
			}
		})
	}
}

// TestUnservedPartNotAdoptedOnALie: a lender that lists an export of a
// part the store places on another lender, under a name the control
// plane does not derive for that part (one made up, another lease's, the
// part's name for another part, a range of another length), is told to
// tear it down, and the part its recorded lender does not serve is lost,
// not adopted.
func TestUnservedPartNotAdoptedOnALie(t *testing.T) {
	t.Parallel()
	e, n1, n2, l := lenders(t)
	other := e.blockLease(e.alice, n1)
	dev := n2.device("disk0")
	madeUp := movedHere(l, 0, "m", dev, 0)
	madeUp.URI = "nbd://127.0.0.2:10809/rlp_made-up"
	anothers := movedHere(other, 0, "m", dev, 0)
	anothers.LeaseID = l.ID
	otherPart := movedHere(l, 0, "m", dev, 0)
	otherPart.URI = "nbd://127.0.0.2:10809/" + movedExport(l.Credential, 1, "m")
	shorter := movedHere(l, 0, "m", dev, 0)
	shorter.Length = 4096
	for what, x := range map[string]api.ServedExport{"a made-up name": madeUp, "another lease's name": anothers, "another part's name": otherPart, "another length": shorter} {
		if r := n2.beat(x); !tearsDown(r, l.ID) {
			t.Errorf("n2 listing the part under %s was not told to tear it down", what)
		}
	}
	n1.beat(served(other, 0))
	n1.beat(served(other, 0))
	got := e.lease(l.ID)
	if got.State != api.LeaseLost || !strings.Contains(got.Reason, "does not serve the lease") || !strings.Contains(got.Reason, n1.id) {
		t.Fatalf("the lease no lender serves: %s (%q), part on %s", got.State, got.Reason, got.Parts[0].NodeID)
	}
}

// TestUnservedStaleCopyTornDown: a lender holds a copy of a part the
// store places on another lender (a move's source that did not let go):
// left in doubt while the recorded lender was not heard, it is torn down
// once the recorded lender's checked heartbeat lists the part.
func TestUnservedStaleCopyTornDown(t *testing.T) {
	t.Parallel()
	e, n1, n2, l := lenders(t)
	x := movedHere(l, 0, "m", n2.device("disk0"), 0)
	if r := n2.beat(x); tearsDown(r, l.ID) {
		t.Fatal("the copy was torn down before the recorded lender was heard")
	}
	n1.beat(served(l, 0))
	if r := n2.beat(x); !tearsDown(r, l.ID) {
		t.Fatal("the stale copy was not torn down once the recorded lender listed the part")
	}
	if got := e.lease(l.ID); got.State != api.LeaseActive || got.Parts[0].NodeID != n1.id {
		t.Fatalf("the lease: %s on %s", got.State, got.Parts[0].NodeID)
	}
}

// TestUnservedPartNotAdoptedOverATakenRange: the range the holder of a
// part serves was placed since for another lease (on the holder's device,
// by the restored database, which found it free): the part cannot be
// adopted there, and after a few checks (the range may be freed
// meanwhile: TestUnservedPartAdoptedOverARangeFreedSince) is recorded
// lost, saying so, rather than torn down in silence.
func TestUnservedPartNotAdoptedOverATakenRange(t *testing.T) {
	t.Parallel()
	e, n1, n2, l := lenders(t)
	since := e.blockLease(e.alice, n2)
	x := movedHere(l, 0, "m", since.Parts[0].DeviceID, since.Parts[0].Offset)
	if r := n2.beat(x, served(since, 0)); tearsDown(r, l.ID) {
		t.Fatal("n2 was told to tear down its copy before the recorded lender was heard")
	}
	for range unservedEvery + 2 {
		n1.beat()
		n2.beat(x, served(since, 0))
	}
	got := e.lease(l.ID)
	if got.State != api.LeaseLost || !strings.Contains(got.Reason, "could not be adopted") || !strings.Contains(got.Reason, n2.id) {
		t.Fatalf("the lease whose copy cannot be adopted: %s (%q)", got.State, got.Reason)
	}
	if got := e.lease(since.ID); got.State != api.LeaseActive || got.Parts[0].NodeID != n2.id {
		t.Fatalf("the lease placed since: %s on %s", got.State, got.Parts[0].NodeID)
	}
}

// TestUnservedPartLost: a composed lease has its two parts on n1's two
// devices; n1 serves part 0 only. An agent older than the lists by part
// lists the lease: served, for its check. One that lists its exports by
// part does not list part 1: the part is recorded lost (and the lease with
// it), saying which part; first after waiting, a few checks at most, for
// n2 (ready, not heard: it may hold the part) to be heard.
func TestUnservedPartLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n1 := e.beater("n1", 1<<30, 1<<30)
	e.beater("n2", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 2 << 20, Affinity: []string{n1.id}})
	if err != nil {
		t.Fatal(err)
	}
	if l.Parts[0].NodeID != n1.id || l.Parts[1].NodeID != n1.id {
		t.Fatalf("parts on %s and %s", l.Parts[0].NodeID, l.Parts[1].NodeID)
	}
	n1.old = true
	for range 3 {
		n1.beat(served(l, 0))
	}
	if got := e.lease(l.ID); got.State != api.LeaseActive {
		t.Fatalf("an older agent listing the lease: %s (%q)", got.State, got.Reason)
	}
	n1.old, n1.check = false, ""
	beats := 0
	for e.lease(l.ID).State == api.LeaseActive && beats < 3+unservedEvery {
		r := n1.beat(served(l, 0))
		if r.Check == "" {
			continue // not checked: the next is
		}
		beats++
	}
	got := e.lease(l.ID)
	if got.State != api.LeaseLost || !strings.Contains(got.Reason, "does not serve part 1 of the lease") || !strings.Contains(got.Reason, n1.id) {
		t.Fatalf("the lease whose part 1 its lender does not serve: %s (%q)", got.State, got.Reason)
	}
	if beats <= 2 {
		t.Fatalf("lost after %d checked heartbeats, without waiting for n2 to be heard", beats)
	}
	if ls, err := e.srv.st.Leases(e.ctx(), store.LeaseFilter{NodeID: n1.id, States: []api.LeaseState{api.LeaseActive}}); err != nil || len(ls) != 0 {
		t.Fatalf("active leases on n1: %d %v", len(ls), err)
	}
}

// TestHeartbeatListsManyExports: a heartbeat that lists its lender's
// exports by part is larger than other requests: one listing 12,000
// exports (more than a 1 MiB body) is taken.
func TestHeartbeatListsManyExports(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n := e.beater("n1", 1<<40)
	l := e.blockLease(e.alice, n)
	xs := []api.ServedExport{served(l, 0)}
	for i := range 12000 {
		x := movedHere(l, 0, fmt.Sprintf("move-%d", i), l.Parts[0].DeviceID, int64(i+1)<<20)
		xs = append(xs, x)
	}
	r := n.beat(xs...)
	if k, ok := keeps(r, l.ID); !ok || len(k.Parts) != 1 {
		t.Fatalf("the answer: %+v", k)
	}
}

// recordMove records, in the store, a move of part i of lease l to dev at
// off on node to, committed (done) and returns its ID: the lease's part is
// there since, served under the name the control plane derives for the
// part and that move.
func (e *env) recordMove(l api.Lease, i int, id, to, dev string, off int64) api.Lease {
	e.t.Helper()
	mv := e.srv.st.(store.Mover)
	l = e.lease(l.ID)
	now := e.clock.Now()
	p := l.Parts[i]
	m := api.Move{ID: id, LeaseID: l.ID, Part: i, Kind: l.Kind, State: api.MoveCopying, From: stripURI(p),
		To: api.Part{NodeID: to, DeviceID: dev, Offset: off, Length: p.Length}, Size: p.Length, StartedAt: now}
	if err := mv.BeginMove(e.ctx(), m, api.Event{At: now, Type: "lease.move.started"}); err != nil {
		e.t.Fatal(err)
	}
	uri := "nbd://127.0.0.2:10809/" + movedExport(l.Credential, i, id)
	if _, err := mv.FinishMove(e.ctx(), id, uri, now, api.Event{At: now, Type: "lease.moved"}); err != nil {
		e.t.Fatal(err)
	}
	if err := mv.EndMove(e.ctx(), id, api.MoveDone, "", p.Length, now, nil); err != nil {
		e.t.Fatal(err)
	}
	e.srv.res.Invalidate()
	return e.lease(l.ID)
}

// TestUnservedStaleCopyOfAnEarlierMoveNotAdopted: a part moved from n1 to
// n2 and then back to n1, both moves recorded. n2 still lists the export
// the first move brought it (a move's source that did not let go, or a
// lender replaying the URI it was once given): the name is the one the
// control plane derives for the part and that move, but the store knows
// the move, and that the part left n2 since. When n1 does not serve the
// part, n2's stale copy is not adopted (its borrower would read what the
// part held before it left n2): n2 is told to tear it down, and the part
// is lost.
func TestUnservedStaleCopyOfAnEarlierMoveNotAdopted(t *testing.T) {
	t.Parallel()
	e, n1, n2, l := lenders(t)
	dev2 := n2.device("disk0")
	e.recordMove(l, 0, "move-there", n2.id, dev2, 8<<20)
	back := e.recordMove(l, 0, "move-back", n1.id, l.Parts[0].DeviceID, 16<<20)
	if back.Parts[0].NodeID != n1.id {
		t.Fatalf("after the moves the part is on %s", back.Parts[0].NodeID)
	}
	stale := movedHere(l, 0, "move-there", dev2, 8<<20)
	e.notAdopted(l.ID, n2, contest(n2, n1, l.ID, 3, stale))
}

// TestUnservedPartNotAdoptedAtAnotherKindOfURI: a lender that holds a part
// under the name the control plane derives for it (a move the store does
// not know brought it) but lists it at a URI the part could not be served
// at — another protocol than the lease's, user information, a fragment,
// no host — is not adopted there: the borrower would be sent to that
// address. The part its lender does not serve is lost.
func TestUnservedPartNotAdoptedAtAnotherKindOfURI(t *testing.T) {
	t.Parallel()
	for what, uri := range map[string]string{
		"another protocol": "http://127.0.0.2:8080/",
		"user information": "nbd://someone:secret@127.0.0.2:10809/",
		"a fragment":       "nbd://127.0.0.2:10809/%s#frag",
		"no host":          "nbd:///",
		"a query":          "nbd://127.0.0.2:10809/?tls=off",
	} {
		t.Run(what, func(t *testing.T) {
			t.Parallel()
			e, n1, n2, l := lenders(t)
			x := movedHere(l, 0, "m", n2.device("disk0"), 4<<20)
			name := movedExport(l.Credential, 0, "m")
			if strings.Contains(uri, "%s") {
				x.URI = fmt.Sprintf(uri, name)
			} else if i := strings.Index(uri, "/?"); i >= 0 {
				x.URI = uri[:i+1] + name + uri[i+1:]
			} else {
				x.URI = uri + name
			}
			if i := partOfExport(l, api.ServedExport{Move: "m", URI: "nbd://127.0.0.2:10809/" + name}); i != 0 {
				t.Fatalf("the proper URI names part %d", i)
			}
			e.notAdopted(l.ID, n2, contest(n2, n1, l.ID, 3, x))
		})
	}
}

// TestUnservedStaleCopyOfAnAdoptedPartNotAdopted: a part adopted on n2
// (a move the store did not know brought it there) moves on to n1, and
// n2 lists its old copy still: the adoption was recorded as that move,
// done, so the copy is known to be stale. When n1 does not serve the part,
// n2's copy is not adopted again.
func TestUnservedStaleCopyOfAnAdoptedPartNotAdopted(t *testing.T) {
	t.Parallel()
	e, n1, n2, l := lenders(t)
	x := movedHere(l, 0, "move-after-the-backup", n2.device("disk0"), 4<<20)
	n1.beat()
	n2.beat(x)
	n1.beat()
	if got := e.lease(l.ID); got.Parts[0].NodeID != n2.id {
		t.Fatalf("not adopted: %s on %s (%q)", got.State, got.Parts[0].NodeID, got.Reason)
	}
	ms, err := e.alice.Moves(e.ctx(), l.ID)
	if err != nil || len(ms) != 1 || ms[0].ID != x.Move {
		t.Fatalf("the adoption's move: %+v %v, want it recorded as %s", ms, err, x.Move)
	}
	e.recordMove(l, 0, "move-on", n1.id, l.Parts[0].DeviceID, 32<<20)
	// n1 is checked every unservedEvery-th heartbeat.
	e.notAdopted(l.ID, n2, contest(n2, n1, l.ID, 2*unservedEvery+2, x))
}

// replicaBeat sends, to server srv (another replica on the env's store),
// node n's heartbeat listing xs, with complete lists and the check of
// srv's last answer to n (*check), and returns the answer.
func replicaBeat(t *testing.T, srv *Server, n *beater, check *string, xs ...api.ServedExport) api.HeartbeatResponse {
	t.Helper()
	h := api.Heartbeat{Health: "ok", LeasesComplete: true, ExportsComplete: true, Check: *check, Exports: xs}
	for _, x := range xs {
		if !slices.Contains(h.Leases, x.LeaseID) {
			h.Leases = append(h.Leases, x.LeaseID)
		}
	}
	r, err := srv.heartbeat(t.Context(), n.id, h)
	if err != nil {
		t.Fatal(err)
	}
	if r.Check != "" {
		*check = r.Check
	}
	return r
}

// TestUnservedClaimOfANodeGoneElsewhereNotAdopted: n2 claims a part on
// replica B (its export of the part, which a move the store does not know
// brought), then goes: removed on replica A (B hears of it on the
// revocation bus), or silent until it is down, and then taken over by a
// join on A, as a machine that holds nothing of the part. When the part's
// recorded lender n1 is shown on B not to serve it, B does not adopt the
// part on the node taken over from n2's claim of before: its borrower
// would be sent to a node that does not serve it.
func TestUnservedClaimOfANodeGoneElsewhereNotAdopted(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"removed", "down"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			b, err := New(e.ctx(), Config{Store: e.srv.st, Clock: e.clock, Lender: e.lender, BootstrapToken: bootTok, Tokens: e.srv.cfg.Tokens})
			if err != nil {
				t.Fatal(err)
			}
			n1, n2 := e.beater("n1", 1<<30), e.beater("n2", 1<<30)
			l := e.blockLease(e.alice, n1)
			var check1, check2 string
			x := movedHere(l, 0, "move-after-the-backup", n2.device("disk0"), 4<<20)
			if r := replicaBeat(t, b, n2, &check2, x); tearsDown(r, l.ID) {
				t.Fatal("n2 was told to tear down its copy before n1 was heard")
			}
			switch how {
			case "removed":
				if _, err := e.admin.RemoveNode(e.ctx(), n2.id, true); err != nil {
					t.Fatal(err)
				}
				b.applyRevocation(e.ctx(), n2.id, nil) // as B hears it on the bus
			case "down":
				// n2 is silent (A's sweep finds it down: its leases, none,
				// are lost); n1 heartbeats meanwhile.
				e.clock.Advance(b.cfg.DownAfter + time.Second)
				n1.beat()
				if err := e.srv.sweepNodes(e.ctx(), e.clock.Now()); err != nil {
					t.Fatal(err)
				}
				if got, err := e.srv.st.Node(e.ctx(), n2.id); err != nil || got.State != api.NodeDown {
					t.Fatalf("n2: %v %v, want down", got.State, err)
				}
			}
			// Another machine takes n2 over on A (it does not present n2's
			// credential).
			if _, err := e.boot.Join(e.ctx(), joinRequest("n2", "", 1<<30)); err != nil {
				t.Fatal(err)
			}
			if got, err := e.srv.st.Node(e.ctx(), n2.id); err != nil || got.State != api.NodeReady {
				t.Fatalf("n2 after the takeover: %v %v", got.State, err)
			}
			for range 3 {
				replicaBeat(t, b, n1, &check1)
			}
			got := e.lease(l.ID)
			if got.Parts[0].NodeID == n2.id {
				t.Fatalf("the part was adopted on the node taken over, from the claim of the node it was: %s (%q)", got.State, got.Reason)
			}
		})
	}
}

// TestUnservedPartAdoptedOverARangeFreedSince: n2 holds the only copy of
// a part recorded on n1 at the range of another lease the restored
// database places there, which n2 no longer serves (it ended after the
// backup, and the move that brought the part took its range). The part's
// check on n1 may end before that other lease's on n2: the range is
// taken then, and the part waits, not lost; once the other lease is
// recorded lost (its range freed), the part is adopted.
func TestUnservedPartAdoptedOverARangeFreedSince(t *testing.T) {
	t.Parallel()
	e, n1, n2, l := lenders(t)
	ended := e.blockLease(e.bob, n2)
	x := movedHere(l, 0, "move-after-the-backup", ended.Parts[0].DeviceID, ended.Parts[0].Offset)
	n1.beat()  // checked: l's part suspected
	n2.beat(x) // checked: the ended lease suspected; x claims l's part
	n1.beat()  // l's part not served: its copy's range is taken still
	if got := e.lease(l.ID); got.State != api.LeaseActive || got.Parts[0].NodeID != n1.id {
		t.Fatalf("while the copy's range is taken: %s on %s (%q)", got.State, got.Parts[0].NodeID, got.Reason)
	}
	n2.beat(x) // the ended lease recorded lost, its range freed
	if got, err := e.bob.Lease(e.ctx(), ended.ID); err != nil || got.State != api.LeaseLost {
		t.Fatalf("the lease n2 does not serve: %s (%q) %v", got.State, got.Reason, err)
	}
	n1.beat()
	got := e.lease(l.ID)
	if got.State != api.LeaseActive || got.Parts[0].NodeID != n2.id || got.Parts[0].Offset != x.Offset {
		t.Fatalf("once the range is free: %s on %s [%d] (%q)", got.State, got.Parts[0].NodeID, got.Parts[0].Offset, got.Reason)
	}
}

// TestUnservedPartHeldTwiceByOneLenderNotAdopted: n2 holds two copies of
// a part recorded on n1, at two ranges, each brought by a move the store
// does not know (the part moved there, away and back, and the first copy
// was not let go). Which one the borrower wrote last is not known: as
// for two lenders that claim a part, neither is adopted, and the part is
// lost, saying so.
func TestUnservedPartHeldTwiceByOneLenderNotAdopted(t *testing.T) {
	t.Parallel()
	e, n1, n2, l := lenders(t)
	dev := n2.device("disk0")
	first, second := movedHere(l, 0, "move-1", dev, 4<<20), movedHere(l, 0, "move-2", dev, 8<<20)
	n1.beat()
	n2.beat(first, second)
	n1.beat()
	got := e.lease(l.ID)
	if got.Parts[0].NodeID == n2.id {
		t.Fatalf("one of two copies on n2 was adopted: [%d]", got.Parts[0].Offset)
	}
	if got.State != api.LeaseLost || !strings.Contains(got.Reason, "none is adopted") || !strings.Contains(got.Reason, n2.id) {
		t.Fatalf("the part held twice: %s (%q)", got.State, got.Reason)
	}
}
