package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
)

// waitState waits, on the transfer's own change notices, until a's
// transfer id is in state want; a transfer that ends otherwise fails t.
func waitState(t *testing.T, a *Agent, id, want string) {
	t.Helper()
	tr, err := a.xfers.get(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	st := tr.status()
	for st.State != want {
		if st.Done() || ctx.Err() != nil {
			t.Fatalf("transfer %s is %s (%s), want %s", id, st.State, st.Error, want)
		}
		st = tr.waitChange(ctx, st.State)
	}
}

// pendingWriter writes blockSize blocks of a part through conns
// connections, workers goroutines each, one write at a time per
// goroutine; each goroutine owns the blocks equal to its index modulo
// the number of goroutines, and stops at its first failed write. model
// is what each block holds once its write was acknowledged.
type pendingWriter struct {
	mu     sync.Mutex
	model  map[int64]uint64
	acked  atomic.Int64
	failed atomic.Int64
	errs   sync.Map // error text -> struct{}
	wg     sync.WaitGroup
}

const pendingBlock = 64 << 10

func pendingStamp(b int64, gen uint64) []byte {
	p := make([]byte, pendingBlock)
	for i := 0; i < len(p); i += 16 {
		binary.LittleEndian.PutUint64(p[i:], uint64(b))
		binary.LittleEndian.PutUint64(p[i+8:], gen)
	}
	return p
}

// startPendingWriter starts the writers; warm is closed once n writes
// have been acknowledged.
func startPendingWriter(ctx context.Context, clients []*nbd.Client, workers int, blocks int64, n int64) (w *pendingWriter, warm <-chan struct{}) {
	w = &pendingWriter{model: map[int64]uint64{}}
	ch := make(chan struct{})
	total := int64(len(clients) * workers)
	for ci, c := range clients {
		for k := range workers {
			idx := int64(ci*workers + k)
			w.wg.Go(func() {
				for gen := uint64(1); ; gen++ {
					own := blocks / total
					b := int64(gen%uint64(own))*total + idx
					if _, err := c.WriteAtContext(ctx, pendingStamp(b, gen), b*pendingBlock, false); err != nil {
						w.failed.Add(1)
						w.errs.Store(err.Error(), struct{}{})
						return
					}
					w.mu.Lock()
					w.model[b] = gen
					w.mu.Unlock()
					if w.acked.Add(1) == n {
						close(ch)
					}
				}
			})
		}
	}
	return w, ch
}

// TestMovePendingBounded: a borrower writing fast through several
// connections while its block part moves costs the source at most its
// MovePendingBytes of writes in memory, though the move's switch holds
// the writes: past it the source takes no more in (the writers wait), and
// it never refuses nor drops a write for it. Every write acknowledged
// reads back from the destination after the move.
func TestMovePendingBounded(t *testing.T) {
	const (
		conns   = 4
		workers = 8
		limit   = 4 * pendingBlock // far below the 32 writes the borrower keeps in flight
		blocks  = movePart / pendingBlock
	)
	_, cp := newFakeCP(t)
	scfg := moveConfig(cp.URL, t.TempDir(), "src")
	scfg.MovePendingBytes = limit
	src := start(t, scfg).a
	dst := start(t, moveConfig(cp.URL, t.TempDir(), "dst")).a
	uri := prepareBlock(t, src, "lease-m", 0, movePart)
	srv := &src.drivers[api.KindBlock].(*BlockDriver).srv

	ctx := ctxFor(t)
	var clients []*nbd.Client
	for range conns {
		c, err := nbd.DialURI(ctx, uri)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	w, warm := startPendingWriter(ctx, clients, workers, blocks, 4*conns*workers)
	within(t, warm, "the borrower's writes are not acknowledged")

	startBlockMove(t, src, dst, "p1", 4<<20, api.TransferOutRequest{ConvergeBytes: 64 << 10, HoldSeconds: 60})
	waitState(t, src, "p1", api.TransferReady)
	if _, err := src.SealTransfer(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	// The writes are held now: the borrower's keep coming until every
	// connection's reader waits to take more in (bounded), or every
	// write in flight is held (not bounded).
	if err := srv.WaitMove(ctx, "x_lease-m", func(st dirty.Stats) bool {
		return st.Reserving == conns || st.Held == conns*workers
	}); err != nil {
		st, _ := srv.MoveStats("x_lease-m")
		t.Fatalf("waiting for the held writes: %v (%+v)", err, st)
	}
	st, _ := srv.MoveStats("x_lease-m")
	t.Logf("while held: %+v", st)
	if st.Peak > limit {
		t.Errorf("the moving export held %d bytes of writes (%d writes held), over its limit of %d", st.Peak, st.Held, limit)
	}
	if st.Reserving != conns {
		t.Errorf("%d of %d connections wait to take more writes in", st.Reserving, conns)
	}
	if v := metricValue(t, src, "rialto_agent_move_pending_bytes"); v != float64(st.Pending) || v == 0 {
		t.Errorf("rialto_agent_move_pending_bytes = %v, want %d", v, st.Pending)
	}
	if n := w.failed.Load(); n != 0 {
		t.Fatalf("%d writes failed before the switch", n)
	}

	cr, err := dst.CommitTransfer(ctx, "p1", api.TransferCommitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.CommitTransfer(ctx, "p1", api.TransferCommitRequest{}); err != nil {
		t.Fatal(err)
	}
	// The switch refused the held writes (and the connections went):
	// every writer has failed once, and stopped.
	w.wg.Wait()
	w.errs.Range(func(k, _ any) bool {
		t.Logf("writes refused at the switch: %v", k)
		return true
	})
	for _, c := range clients {
		if _, err := c.WriteAtContext(ctx, make([]byte, 4096), 0, false); err == nil {
			t.Error("the retired part took a write")
		} else if !errors.Is(err, nbd.ErrClosed) {
			t.Logf("a write after the switch: %v", err)
		}
	}

	d, err := nbd.DialURI(ctx, cr.URI)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := make([]byte, pendingBlock)
	bad := 0
	for b := range int64(blocks) {
		if _, err := d.ReadAt(p, b*pendingBlock); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, pendingBlock)
		if gen, ok := w.model[b]; ok {
			want = pendingStamp(b, gen)
		}
		if !bytes.Equal(p, want) {
			if bad++; bad <= 3 {
				t.Errorf("block %d at the destination holds gen %d, want the acknowledged %d", b, binary.LittleEndian.Uint64(p[8:]), w.model[b])
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d blocks differ from the acknowledged writes (%d acknowledged)", bad, blocks, w.acked.Load())
	}
	t.Logf("%d writes acknowledged, %d refused at the switch", w.acked.Load(), w.failed.Load())
}

// metricValue is the value of a's gauge name (one series).
func metricValue(t *testing.T, a *Agent, name string) float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
