package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
)

const (
	moveDisk = 16 << 20
	movePart = 8 << 20
)

// moveConfig is an agent named name lending a 16 MiB disk0.
func moveConfig(url, dir, name string) Config {
	return Config{ControlPlane: url, BootstrapToken: "boot", Name: name, StateDir: dir,
		Devices: []DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: moveDisk}}}
}

// moveRig is two agents and a block part on the first, attached through
// stripe.Attach (the borrower's path) whose Resolve follows cur.
type moveRig struct {
	src, dst *Agent
	srcDir   string
	dstDir   string
	cur      atomic.Value // the part's URI now
	att      *stripe.Attachment
	vol      *nbd.Client // the borrower's view
}

func newMoveRig(t *testing.T) *moveRig {
	_, srv := newFakeCP(t)
	r := &moveRig{srcDir: t.TempDir(), dstDir: t.TempDir()}
	r.src = start(t, moveConfig(srv.URL, r.srcDir, "src")).a
	r.dst = start(t, moveConfig(srv.URL, r.dstDir, "dst")).a
	r.cur.Store(prepareBlock(t, r.src, "lease-m", 0, movePart))
	resolve := func(context.Context, int) (string, error) { return r.cur.Load().(string), nil }
	att, err := stripe.Attach(ctxFor(t), stripe.AttachConfig{URIs: []string{r.cur.Load().(string)}, Resolve: resolve,
		RequestTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { att.Close() })
	r.att = att
	if r.vol, err = nbd.DialURI(ctxFor(t), att.URI()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.vol.Close() })
	return r
}

// receive and send start a transfer of the part to dst's disk0 at dstOff.
func (r *moveRig) start(t *testing.T, id string, dstOff int64, out api.TransferOutRequest) api.TransferInResponse {
	t.Helper()
	return startBlockMove(t, r.src, r.dst, id, dstOff, out)
}

// startBlockMove starts transfer id of lease-m's part (x_lease-m, movePart
// bytes) from src to dst's disk0 at dstOff: dst receives it, then src
// sends it, with out's other fields.
func startBlockMove(t *testing.T, src, dst *Agent, id string, dstOff int64, out api.TransferOutRequest) api.TransferInResponse {
	t.Helper()
	in, err := dst.ReceiveTransfer(ctxFor(t), api.TransferInRequest{ID: id, Token: "tok_" + id,
		Part: api.PrepareRequest{LeaseID: "lease-m", Kind: api.KindBlock, DeviceName: "disk0", Offset: dstOff, Length: movePart,
			Export: "x_lease-m.moved"}})
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	out.ID, out.LeaseID, out.Export, out.DestURI = id, "lease-m", "x_lease-m", in.URI
	if _, err := src.SendTransfer(ctxFor(t), out); err != nil {
		t.Fatalf("send: %v (the source answers before the move's start, whose failure belongs in the transfer's state)", err)
	}
	return in
}

// blockMovers starts, against one fake control plane, a source agent
// (src) lending disk0 through drv and a destination (dst) with the plain
// block driver, and prepares lease-m's part on the source: it returns
// both agents and the part's URI.
func blockMovers(t *testing.T, drv Driver) (src, dst *Agent, uri string) {
	t.Helper()
	_, srv := newFakeCP(t)
	cfg := moveConfig(srv.URL, t.TempDir(), "src")
	cfg.Drivers = map[api.Kind]Driver{api.KindBlock: drv}
	src = start(t, cfg).a
	dst = start(t, moveConfig(srv.URL, t.TempDir(), "dst")).a
	return src, dst, prepareBlock(t, src, "lease-m", 0, movePart)
}

// writesServed checks that the part at uri is served, its writes not
// held: a write through it completes (after says after what).
func writesServed(t *testing.T, uri, after string) {
	t.Helper()
	c, err := nbd.DialURI(ctxFor(t), uri)
	if err != nil {
		t.Fatalf("dialling the part after %s: %v", after, err)
	}
	defer c.Close()
	if _, err := c.WriteAtContext(ctxFor(t), make([]byte, 4096), 0, false); err != nil {
		t.Fatalf("a write after %s: %v", after, err)
	}
}

// waitTransfer waits until a's transfer id is in state want.
func waitTransfer(t *testing.T, a *Agent, id, want string) api.Transfer {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := a.Transfer(id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == want {
			return st
		}
		if st.Done() || time.Now().After(deadline) {
			t.Fatalf("transfer %s is %s (%s), want %s", id, st.State, st.Error, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// writer writes 4 KiB blocks through the borrower's view, each block
// stamped with its number and a generation, and remembers what each
// block holds once its write has completed. Each worker owns the blocks
// equal to its index modulo the number of workers.
type writer struct {
	vol     *nbd.Client
	blocks  int64
	mu      sync.Mutex
	model   map[int64]uint64
	writes  atomic.Int64
	errs    atomic.Int64
	lastErr atomic.Value
	stop    chan struct{}
	wg      sync.WaitGroup
}

func stamp(block int64, gen uint64) []byte {
	p := make([]byte, 4096)
	for i := 0; i < len(p); i += 16 {
		binary.LittleEndian.PutUint64(p[i:], uint64(block))
		binary.LittleEndian.PutUint64(p[i+8:], gen)
	}
	return p
}

func startWriter(vol *nbd.Client, blocks int64, workers int) *writer {
	w := &writer{vol: vol, blocks: blocks, model: map[int64]uint64{}, stop: make(chan struct{})}
	for k := range workers {
		w.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 7))
			for gen := uint64(1); ; gen++ {
				select {
				case <-w.stop:
					return
				default:
				}
				b := rng.Int64N(blocks/int64(workers))*int64(workers) + int64(k)
				if _, err := vol.WriteAt(stamp(b, gen), b*4096); err != nil {
					w.errs.Add(1)
					w.lastErr.Store(err.Error())
					continue
				}
				w.mu.Lock()
				w.model[b] = gen
				w.mu.Unlock()
				w.writes.Add(1)
			}
		})
	}
	return w
}

func (w *writer) halt() { close(w.stop); w.wg.Wait() }

// waitWrites waits until n more writes have completed.
func (w *writer) waitWrites(t *testing.T, n int64) {
	t.Helper()
	base := w.writes.Load()
	deadline := time.Now().Add(30 * time.Second)
	for w.writes.Load() < base+n {
		if time.Now().After(deadline) {
			t.Fatalf("the writer made %d writes in 30 s (errors: %d, last %v)", w.writes.Load()-base, w.errs.Load(), w.lastErr.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// check compares every block read through read with the model (blocks
// never written read as the prefill, or zeroes).
func (w *writer) check(t *testing.T, what string, read func(p []byte, off int64) error, prefill func(b int64) []byte) {
	t.Helper()
	p := make([]byte, 4096)
	bad := 0
	for b := range w.blocks {
		if err := read(p, b*4096); err != nil {
			t.Fatalf("%s: read block %d: %v", what, b, err)
		}
		want := prefill(b)
		if gen, ok := w.model[b]; ok {
			want = stamp(b, gen)
		}
		if !bytes.Equal(p, want) {
			if bad++; bad <= 3 {
				t.Errorf("%s: block %d holds gen %d, want %d", what, b, binary.LittleEndian.Uint64(p[8:]), w.model[b])
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d blocks wrong", what, bad, w.blocks)
	}
}

// TestMoveBlockUnderWrites moves a block part from one agent to another
// while a borrower (through stripe.Attach, as `rialto attach` does) keeps
// writing: the copy runs passes until it converges, holds the writes for
// the last one, and the switch retires the old export. The borrower sees
// no error, every block holds what was last written to it (at the new
// place, and through the borrower), the old range is wiped and the
// transfer's counters say what moved.
func TestMoveBlockUnderWrites(t *testing.T) {
	r := newMoveRig(t)
	// Data in the first half, holes in the second.
	const blocks = movePart / 4096
	prefill := func(b int64) []byte {
		if b < blocks/4 {
			return bytes.Repeat([]byte{byte(b)}, 4096)
		}
		return make([]byte, 4096)
	}
	for b := int64(0); b < blocks/4; b++ {
		if _, err := r.vol.WriteAt(prefill(b), b*4096); err != nil {
			t.Fatal(err)
		}
	}
	w := startWriter(r.vol, blocks, 4)
	w.waitWrites(t, 200)
	// Once ready, the source holds the borrower's writes until the
	// switch: the control plane seals and commits at once.
	r.start(t, "t1", 4<<20, api.TransferOutRequest{ConvergeBytes: 64 << 10, HoldSeconds: 20})
	st := waitTransfer(t, r.src, "t1", api.TransferReady)
	if _, err := r.src.SealTransfer(ctxFor(t), "t1"); err != nil {
		t.Fatal(err)
	}
	cr, err := r.dst.CommitTransfer(ctxFor(t), "t1", api.TransferCommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r.cur.Store(cr.URI)
	if _, err := r.src.CommitTransfer(ctxFor(t), "t1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	w.waitWrites(t, 200) // after the switch, at the new place
	w.halt()
	if n := w.errs.Load(); n != 0 {
		t.Fatalf("the borrower saw %d write errors (last: %v)", n, w.lastErr.Load())
	}
	if err := r.vol.Flush(); err != nil {
		t.Fatalf("flush after the move: %v", err)
	}
	w.check(t, "through the borrower", func(p []byte, off int64) error { _, err := r.vol.ReadAt(p, off); return err }, prefill)
	direct, err := nbd.DialURI(ctxFor(t), cr.URI)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	w.check(t, "at the new place", func(p []byte, off int64) error { _, err := direct.ReadAt(p, off); return err }, prefill)

	st, _ = r.src.Transfer("t1")
	if st.State != api.TransferCommitted || st.Copied < movePart/4 || st.Skipped == 0 || st.HeldMillis <= 0 {
		t.Errorf("source's transfer: %+v", st)
	}
	t.Logf("source's transfer: %d passes, %d bytes copied, %d zero, writes held %.1f ms", st.Pass, st.Copied, st.Skipped, st.HeldMillis)
	if v := testutil.ToFloat64(r.src.mMoved.WithLabelValues("block")); v != float64(st.Copied) {
		t.Errorf("rialto_agent_moved_bytes_total = %v, want %d", v, st.Copied)
	}
	if got := r.src.Leases(); len(got) != 0 {
		t.Errorf("the source still keeps %v", got)
	}
	if got := r.dst.Leases(); len(got) != 1 || got[0] != "lease-m" {
		t.Errorf("the destination keeps %v", got)
	}
	// The old range is wiped (in the background: the commit answered
	// before), the new one persisted.
	within(t, r.src.bg.done(), "the old range's wipe did not end")
	old := make([]byte, movePart)
	f, err := os.Open(filepath.Join(r.srcDir, "disk0.img"))
	if err != nil {
		t.Fatal(err)
	}
	f.ReadAt(old, 0)
	f.Close()
	if !bytes.Equal(old, make([]byte, movePart)) {
		t.Error("the source's old range was not wiped")
	}
	var saved []persistedExport
	if err := readJSON(filepath.Join(r.dstDir, exportsFile), &saved); err != nil || len(saved) != 1 || saved[0].URI != cr.URI {
		t.Errorf("the destination persisted %+v (%v)", saved, err)
	}
	for _, a := range []*Agent{r.src, r.dst} {
		if n := testutil.ToFloat64(a.mPendingWipes); n != 0 {
			t.Errorf("%d wipes pending", int(n))
		}
	}
}

// TestMoveAborted: an abort in the middle of the copy leaves the part
// served by the source as before (writes go on) and wipes what the
// destination received; its range is lendable again.
func TestMoveAborted(t *testing.T) {
	r := newMoveRig(t)
	w := startWriter(r.vol, movePart/4096, 2)
	r.start(t, "t2", 0, api.TransferOutRequest{})
	waitTransfer(t, r.src, "t2", api.TransferReady)
	if _, err := r.src.AbortTransfer(ctxFor(t), "t2"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.dst.AbortTransfer(ctxFor(t), "t2"); err != nil {
		t.Fatal(err)
	}
	w.waitWrites(t, 100)
	w.halt()
	if n := w.errs.Load(); n != 0 {
		t.Fatalf("the borrower saw %d write errors (last: %v)", n, w.lastErr.Load())
	}
	if st, _ := r.src.Transfer("t2"); st.State != api.TransferAborted {
		t.Errorf("source: %+v", st)
	}
	if _, err := r.src.CommitTransfer(ctxFor(t), "t2", api.TransferCommitRequest{}); !errors.Is(err, ErrTransferState) {
		t.Errorf("commit after abort: %v", err)
	}
	if n := testutil.ToFloat64(r.dst.mPendingWipes); n != 0 {
		t.Errorf("%d wipes pending on the destination", int(n))
	}
	got := nbdRead(t, prepareBlock(t, r.dst, "lease-next", 0, movePart), movePart, 0)
	if !bytes.Equal(got, make([]byte, movePart)) {
		t.Error("the next lease of the destination's range reads the aborted transfer's bytes")
	}
}

// TestMoveHoldLapses: a ready transfer that is not sealed in time fails
// and the source serves the held writes again; a late seal is refused.
func TestMoveHoldLapses(t *testing.T) {
	r := newMoveRig(t)
	w := startWriter(r.vol, movePart/4096, 2)
	r.start(t, "t3", 0, api.TransferOutRequest{HoldSeconds: 0.05})
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := r.src.Transfer("t3")
		if st.State == api.TransferFailed {
			if want := "not sealed within 50ms of the copy's end; the part is served here again"; st.Error != want {
				t.Errorf("the transfer's error: %q, want %q", st.Error, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transfer %+v did not fail", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.waitWrites(t, 100)
	w.halt()
	if n := w.errs.Load(); n != 0 {
		t.Fatalf("the borrower saw %d write errors (last: %v)", n, w.lastErr.Load())
	}
	if _, err := r.src.SealTransfer(ctxFor(t), "t3"); !errors.Is(err, ErrTransferState) {
		t.Errorf("seal after the hold lapsed: %v", err)
	}
}

// TestMoveReceivedRangeWipedOnRestart: a destination that restarts in the
// middle of a transfer forgets it and wipes what it received.
func TestMoveReceivedRangeWipedOnRestart(t *testing.T) {
	cp, srv := newFakeCP(t)
	_ = cp
	dir := t.TempDir()
	cfg := moveConfig(srv.URL, dir, "dst")
	rd := start(t, cfg)
	in, err := rd.a.ReceiveTransfer(ctxFor(t), api.TransferInRequest{ID: "t4", Token: "tok4",
		Part: api.PrepareRequest{LeaseID: "lease-m", DeviceName: "disk0", Offset: 0, Length: movePart, Export: "x_new"}})
	if err != nil {
		t.Fatal(err)
	}
	nbdWrite(t, in.URI, bytes.Repeat([]byte("tenant bytes "), 1000), 0)
	if got := rd.a.Leases(); len(got) != 0 {
		t.Errorf("a part being received is reported: %v", got)
	}
	rd.halt(t)
	a := start(t, cfg).a
	got := nbdRead(t, prepareBlock(t, a, "lease-next", 0, movePart), 13000, 0)
	if !bytes.Equal(got, make([]byte, 13000)) {
		t.Error("a range received before a restart was lent with its bytes")
	}
}

// TestMoveReceiveExpires: a received range whose transfer is not
// committed by its expiry is wiped.
func TestMoveReceiveExpires(t *testing.T) {
	_, srv := newFakeCP(t)
	clk := clock.NewFake(time.Now())
	cfg := moveConfig(srv.URL, t.TempDir(), "dst")
	cfg.Clock = clk
	a := start(t, cfg).a
	in, err := a.ReceiveTransfer(ctxFor(t), api.TransferInRequest{ID: "t5", Token: "tok5", ExpiresAt: clk.Now().Add(time.Minute),
		Part: api.PrepareRequest{LeaseID: "lease-m", DeviceName: "disk0", Offset: 0, Length: movePart, Export: "x_new"}})
	if err != nil {
		t.Fatal(err)
	}
	nbdWrite(t, in.URI, []byte("tenant bytes"), 0)
	if _, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "other", DeviceName: "disk0", Offset: 0, Length: 4096, Export: "x_o"}); !errors.Is(err, ErrOverlap) {
		t.Errorf("prepare over a range being received: %v", err)
	}
	clk.Advance(2 * time.Minute)
	if err := a.Heartbeat(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if st, _ := a.Transfer("t5"); st.State != api.TransferAborted {
		t.Fatalf("after its expiry the transfer is %+v", st)
	}
	if served(t, in.URI) {
		t.Error("the transfer's export is still served")
	}
	got := nbdRead(t, prepareBlock(t, a, "lease-next", 0, movePart), 12, 0)
	if !bytes.Equal(got, make([]byte, 12)) {
		t.Error("an expired transfer's range was lent with its bytes")
	}
}

// TestTransferAPI drives the transfer API over HTTP: authentication,
// refusals, and a whole move of an idle part.
func TestTransferAPI(t *testing.T) {
	_, srv := newFakeCP(t)
	src := start(t, moveConfig(srv.URL, t.TempDir(), "src")).a
	dst := start(t, moveConfig(srv.URL, t.TempDir(), "dst")).a
	uri := prepareBlock(t, src, "lease-a", 0, movePart)
	nbdWrite(t, uri, []byte("hello"), 4096)
	in := api.TransferInRequest{ID: "t6", Token: "tok6", Part: api.PrepareRequest{LeaseID: "lease-a", DeviceName: "disk0",
		Offset: movePart, Length: movePart, Export: "x_a2"}}
	for _, tc := range []struct {
		name, key, path string
		body            any
		status          int
	}{
		{"no key", "", "/agent/v1/transfers/in", in, 401},
		{"bad body", "key-1", "/agent/v1/transfers/in", "nope", 400},
		{"unknown field", "key-1", "/agent/v1/transfers/in", map[string]any{"id": "x", "bogus": 1}, 400},
		{"no token", "key-1", "/agent/v1/transfers/in", api.TransferInRequest{ID: "x", Part: in.Part}, 400},
		{"range outside", "key-1", "/agent/v1/transfers/in", api.TransferInRequest{ID: "x", Token: "t", Part: api.PrepareRequest{LeaseID: "l", DeviceName: "disk0", Offset: moveDisk, Length: 4096, Export: "e"}}, 400},
		{"unknown device", "key-1", "/agent/v1/transfers/in", api.TransferInRequest{ID: "x", Token: "t", Part: api.PrepareRequest{LeaseID: "l", DeviceName: "nope", Length: 4096, Export: "e"}}, 404},
		{"unknown export", "key-1", "/agent/v1/transfers/out", api.TransferOutRequest{ID: "x", Export: "nope", DestURI: "nbd://127.0.0.1:1/x"}, 404},
		{"unknown transfer", "key-1", "/agent/v1/transfers/nope/seal", nil, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := call(t, dst, tc.key, tc.path, tc.body)
			if resp.StatusCode != tc.status {
				t.Errorf("%s: %d %s, want %d", tc.path, resp.StatusCode, body, tc.status)
			}
		})
	}
	resp, body := call(t, dst, "key-1", "/agent/v1/transfers/in", in)
	if resp.StatusCode != 200 {
		t.Fatalf("in: %d %s", resp.StatusCode, body)
	}
	var ir api.TransferInResponse
	json.Unmarshal(body, &ir)
	if resp, body := call(t, dst, "key-1", "/agent/v1/transfers/in", in); resp.StatusCode != 409 {
		t.Errorf("the same transfer twice: %d %s", resp.StatusCode, body)
	}
	resp, body = call(t, src, "key-1", "/agent/v1/transfers/out", api.TransferOutRequest{ID: "t6", LeaseID: "lease-a", Export: "x_lease-a", DestURI: ir.URI})
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("out: %d %s", resp.StatusCode, body)
	}
	if resp, body := call(t, src, "key-1", "/agent/v1/transfers/t6/commit", nil); resp.StatusCode != 409 {
		t.Errorf("commit before the seal: %d %s", resp.StatusCode, body)
	}
	waitTransfer(t, src, "t6", api.TransferReady)
	for _, step := range []struct {
		a    *Agent
		path string
	}{{src, "seal"}, {dst, "commit"}, {src, "commit"}} {
		if resp, body := call(t, step.a, "key-1", "/agent/v1/transfers/t6/"+step.path, nil); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", step.path, resp.StatusCode, body)
		}
	}
	if resp, body := call(t, dst, "key-1", "/agent/v1/transfers/t6/abort", nil); resp.StatusCode != 409 {
		t.Errorf("abort after the commit: %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodGet, src.AgentURL()+"/agent/v1/transfers/t6", nil)
	req.Header.Set("Authorization", "Bearer key-1")
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var st api.Transfer
	json.NewDecoder(hr.Body).Decode(&st)
	hr.Body.Close()
	if st.State != api.TransferCommitted || st.Role != "out" || st.Size != movePart {
		t.Errorf("status %+v", st)
	}
	got := nbdRead(t, "nbd://"+dst.Endpoint(api.KindBlock)+"/x_a2", 5, 4096)
	if string(got) != "hello" {
		t.Errorf("the moved part reads %.40q", got)
	}
	if served(t, uri) {
		t.Error("the old export is still served")
	}
	_ = fmt.Sprint
}

// TestTeardownOfSealedMove: a lease torn down while its part's move is
// sealed (the lease may already point at the destination) does not serve
// the held writes here: the move is committed, its export retired
// (ESHUTDOWN), torn down and wiped.
func TestTeardownOfSealedMove(t *testing.T) {
	r := newMoveRig(t)
	plain, err := nbd.DialURI(ctxFor(t), r.cur.Load().(string))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.WriteAt(bytes.Repeat([]byte{9}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	r.start(t, "t7", 0, api.TransferOutRequest{})
	waitTransfer(t, r.src, "t7", api.TransferReady)
	if _, err := r.src.SealTransfer(ctxFor(t), "t7"); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() {
		_, err := plain.WriteAt(bytes.Repeat([]byte{7}, 4096), 0)
		held <- err
	}()
	// The write must be held by the sealed move before the teardown, or
	// it would meet a closed export instead.
	srv := &r.src.drivers[api.KindBlock].(*BlockDriver).srv
	for deadline := time.Now().Add(30 * time.Second); srv.HeldWrites("x_lease-m") == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the write was never held by the sealed move")
		}
		runtime.Gosched()
	}
	if err := r.src.Teardown(ctxFor(t), "lease-m"); err != nil {
		t.Fatal(err)
	}
	if err := <-held; !errors.Is(err, nbd.ErrShutdown) {
		t.Errorf("a write held by the sealed move: %v, want ESHUTDOWN", err)
	}
	if st, _ := r.src.Transfer("t7"); st.State != api.TransferCommitted {
		t.Errorf("the sealed transfer after the teardown: %+v", st)
	}
	old := make([]byte, 4096)
	f, _ := os.Open(filepath.Join(r.srcDir, "disk0.img"))
	f.ReadAt(old, 0)
	f.Close()
	if !bytes.Equal(old, make([]byte, 4096)) {
		t.Error("the torn-down range was not wiped")
	}
}
