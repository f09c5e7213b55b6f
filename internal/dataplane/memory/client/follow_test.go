package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// where is a Relocator whose answer the test changes (the control plane's
// record of the lease).
type where struct {
	mu         sync.Mutex
	addr, cred string
	ended      bool
	asked      atomic.Int64
}

func (w *where) set(addr, cred string) {
	w.mu.Lock()
	w.addr, w.cred = addr, cred
	w.mu.Unlock()
}

func (w *where) relocate(context.Context) (string, string, error) {
	w.asked.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return "", "", ErrEnded
	}
	return w.addr, w.cred, nil
}

// TestFollowingFollowsMove: a session that follows its region keeps
// working across a move on every channel while a writer runs: the writes
// held at the switch are retried at the new place, nothing fails, and
// every byte is what was last written. Once the lease ends, a request
// fails with the region's error.
func TestFollowingFollowsMove(t *testing.T) {
	const size = 4 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	from := memorytest.Start(t, size, 0)
	to := memorytest.Start(t, 4096, 0)
	w := &where{addr: from.Addr, cred: testCred}
	f, err := DialFollowing(ctx, from.Addr, testCred, Options{Timeout: 5 * time.Second}, FollowConfig{Relocate: w.relocate})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	model := make([]byte, size)
	for i, rng := 0, rand.New(rand.NewPCG(1, 2)); i < size; i += 8 {
		binary.LittleEndian.PutUint64(model[i:], rng.Uint64())
	}
	if err := f.Write(ctx, ChannelBulk, model, 0); err != nil {
		t.Fatal(err)
	}
	// A writer of 4 KiB blocks on every channel while the region moves;
	// each block holds its own index and a generation.
	var mu sync.Mutex
	stop := make(chan struct{})
	var writes atomic.Int64
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(3, 4))
		for gen := byte(1); ; gen++ {
			select {
			case <-stop:
				return
			default:
			}
			b := rng.IntN(size / 4096)
			p := bytes.Repeat([]byte{gen}, 4096)
			mu.Lock() // the model follows the order of completed writes
			err := f.Write(ctx, channels[int(gen)%len(channels)], p, int64(b)*4096)
			if err == nil {
				copy(model[b*4096:], p)
			}
			mu.Unlock()
			if err != nil {
				select {
				case errc <- err:
				default:
				}
				return
			}
			writes.Add(1)
		}
	})
	waitFor := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for base := writes.Load(); writes.Load() < base+n; {
			select {
			case err := <-errc:
				t.Fatalf("a write failed: %v", err)
			case <-time.After(time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatal("the writer stalled")
			}
		}
	}
	waitFor(50)
	if err := memorytest.Move(ctx, from, to, "moved-cred", func() { w.set(to.Addr, "moved-cred") }); err != nil {
		t.Fatal(err)
	}
	waitFor(50)
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatalf("a write failed across the move: %v", err)
	default:
	}
	if f.Moves() != 1 || f.Client() == nil {
		t.Fatalf("moves %d", f.Moves())
	}
	for _, ch := range channels {
		got := make([]byte, size)
		if err := f.Read(ctx, ch, got, 0); err != nil {
			t.Fatalf("%v read after the move: %v", ch, err)
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("%v read after the move: other bytes", ch)
		}
	}
	// The lease ends: the region goes away, and the relocation says so.
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
	asked := w.asked.Load()
	if err := to.D.RemoveRegion("moved-cred"); err != nil {
		t.Fatal(err)
	}
	err = f.Write(ctx, ChannelSync, make([]byte, 4096), 0)
	if !errors.Is(err, ErrEnded) || !(errors.Is(err, protocol.ErrGone) || errors.Is(err, protocol.ErrDonorLost)) || w.asked.Load() != asked+1 {
		t.Fatalf("a write once the lease ended: %v (asked %d times)", err, w.asked.Load()-asked)
	}
}

// TestFollowingRefusesRecreatedRegion: when the region is created again
// at its place under the same credential (its donor restarted and serves
// a fresh, zeroed region at the same URI), a following session that
// reconnects refuses it with protocol.ErrRecreated instead of reading
// zeroes where its data was, and keeps refusing; a new session on the new
// region sees another generation. A region that moved (another place) is
// followed as before: its generation is its own.
func TestFollowingRefusesRecreatedRegion(t *testing.T) {
	const size = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	td := memorytest.Start(t, size, 0)
	w := &where{addr: td.Addr, cred: testCred}
	f, err := DialFollowing(ctx, td.Addr, testCred, Options{Timeout: 5 * time.Second}, FollowConfig{Relocate: w.relocate})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first := f.Client().Generation()
	if first == 0 {
		t.Fatal("the donor reported no generation")
	}
	want := bytes.Repeat([]byte("kept "), 1000)
	if err := f.Write(ctx, ChannelSync, want, 0); err != nil {
		t.Fatal(err)
	}
	// The region is created again under the same credential.
	if err := td.D.RemoveRegion(testCred); err != nil {
		t.Fatal(err)
	}
	if err := td.D.AddRegion(testCred, size); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	for _, ch := range []Channel{ChannelSync, ChannelBulk} {
		err := f.Read(ctx, ch, got, 0)
		if !errors.Is(err, protocol.ErrRecreated) {
			t.Fatalf("%v read after the region was recreated: %v (zeroes: %v), want ErrRecreated", ch, err, bytes.Equal(got, make([]byte, len(got))))
		}
	}
	if _, _, err := f.Rejoin(ctx, protocol.KindSync, ConnRef{}); !errors.Is(err, protocol.ErrRecreated) {
		t.Fatalf("Rejoin after the region was recreated: %v, want ErrRecreated", err)
	}
	// The refused session's connection closes; the donor lets the region
	// go once it has read the close, which the dial may race (ErrBusy).
	c, err := Dial(ctx, td.Addr, testCred, Options{})
	for errors.Is(err, protocol.ErrBusy) && ctx.Err() == nil {
		c, err = Dial(ctx, td.Addr, testCred, Options{})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if g := c.Generation(); g == 0 || g == first {
		t.Fatalf("the recreated region's generation is %#x, the first one's %#x", g, first)
	}
}

// TestFollowingAdoptsMovedGeneration: a region that moved to another
// donor has a generation of its own there; the session follows it, and
// then reconnects there as long as that generation holds.
func TestFollowingAdoptsMovedGeneration(t *testing.T) {
	const size = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	from := memorytest.Start(t, size, 0)
	to := memorytest.Start(t, size, 0)
	w := &where{addr: from.Addr, cred: testCred}
	f, err := DialFollowing(ctx, from.Addr, testCred, Options{Timeout: 5 * time.Second}, FollowConfig{Relocate: w.relocate})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := from.D.RemoveRegion(testCred); err != nil { // moved away
		t.Fatal(err)
	}
	w.set(to.Addr, testCred)
	if err := f.Read(ctx, ChannelSync, make([]byte, 4096), 0); err != nil {
		t.Fatalf("read after the move: %v", err)
	}
	if f.Moves() != 1 {
		t.Fatalf("moves = %d", f.Moves())
	}
	// The session at the new place ends (its control connection closes);
	// the region there is the same: the session opens again.
	_ = f.Client().Close()
	if err := f.Read(ctx, ChannelSync, make([]byte, 4096), 0); err != nil {
		t.Fatalf("read after the session at the new place was reopened: %v", err)
	}
}

// TestFollowingKeepsGenerationAcrossMoves: a move carries the region's
// generation (memorytest.Move does what an agent's move does). The
// session that follows the region from A to B sees there the generation
// it saw at A. A lease then moved from B to A and back to B under the
// same credential while the session made no request is the region the
// session had: the idle session opens again at B and reads its bytes,
// where it refused a region with a third generation as recreated
// (protocol.ErrRecreated) when a move did not carry it.
func TestFollowingKeepsGenerationAcrossMoves(t *testing.T) {
	const size = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := memorytest.Start(t, size, 0)
	b := memorytest.Start(t, size, 0)
	// B receives the lease's region under the lease's credential.
	if err := b.D.RemoveRegion(testCred); err != nil {
		t.Fatal(err)
	}
	w := &where{addr: a.Addr, cred: testCred}
	f, err := DialFollowing(ctx, a.Addr, testCred, Options{Timeout: 5 * time.Second}, FollowConfig{Relocate: w.relocate})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first := f.Client().Generation()
	want := bytes.Repeat([]byte("moved twice "), 1000)
	if err := f.Write(ctx, ChannelSync, want, 0); err != nil {
		t.Fatal(err)
	}
	// move moves the region from one donor to the other, under the same
	// credential, and removes it at the source as its agent does.
	move := func(from, to *memorytest.Donor) {
		t.Helper()
		if err := memorytest.Move(ctx, from, to, testCred, func() { w.set(to.Addr, testCred) }); err != nil {
			t.Fatal(err)
		}
		if err := from.D.RemoveRegion(testCred); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		for _, ch := range channels {
			got := make([]byte, len(want))
			if err := f.Read(ctx, ch, got, 0); err != nil {
				t.Fatalf("%v read %s: %v", ch, when, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%v read %s: other bytes", ch, when)
			}
		}
		if g := f.Client().Generation(); g != first {
			t.Fatalf("%s the session sees generation %#x, it saw %#x at first", when, g, first)
		}
	}

	move(a, b)
	check("after the move to B")
	if f.Moves() != 1 {
		t.Fatalf("moves = %d after the move to B", f.Moves())
	}
	// Away and back while the session is idle: it finds the region where
	// it was, under the same credential.
	move(b, a)
	move(a, b)
	check("after the moves to A and back to B")
	if f.Moves() != 1 {
		t.Fatalf("moves = %d: the session saw the region elsewhere", f.Moves())
	}
}

// TestFollowReportsWhatFailedNotTheDeadline: a follow whose attempts fail
// (a new place whose certificate is not trusted) and whose last attempt
// is cut short by the follow's deadline reports what failed, not the
// deadline.
func TestFollowReportsWhatFailedNotTheDeadline(t *testing.T) {
	const size = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ca, other := memorytest.NewCA(t), memorytest.NewCA(t)
	from := memorytest.StartTLS(t, memorytest.ServerTLS(t, ca), size, 0)
	to := memorytest.StartTLS(t, memorytest.ServerTLS(t, other), size, 0)
	to.ClientTLS = memorytest.ClientTLS(t, other) // the move itself trusts it
	var asked atomic.Int64
	var moved atomic.Bool
	relocate := func(ctx context.Context) (string, string, error) {
		if !moved.Load() {
			return from.Addr, memorytest.Credential, nil
		}
		if asked.Add(1) == 1 {
			return to.Addr, "moved-cred", nil
		}
		<-ctx.Done() // the next attempt outlasts the follow
		return "", "", ctx.Err()
	}
	f, err := DialFollowing(ctx, from.Addr, memorytest.Credential, Options{Timeout: 5 * time.Second, TLS: memorytest.ClientTLS(t, ca)},
		FollowConfig{Relocate: relocate, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := memorytest.Move(ctx, from, to, "moved-cred", func() { moved.Store(true) }); err != nil {
		t.Fatal(err)
	}
	err = f.Read(ctx, ChannelSync, make([]byte, 4096), 0)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a read whose follow found only an untrusted place: %v, want the refused certificate", err)
	}
	if asked.Load() < 2 {
		t.Fatalf("the follow asked where the region is %d time(s), want a second attempt cut by the deadline", asked.Load())
	}
}
