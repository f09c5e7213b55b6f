package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

const testCred = memorytest.Credential

func dial(t testing.TB, addr string, opts Options) *Client {
	t.Helper()
	c, err := Dial(context.Background(), addr, testCred, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var channels = []Channel{ChannelSync, ChannelBulk, ChannelQueue, ChannelAdaptive}

func TestChannelsIntegrity(t *testing.T) {
	const size = 8 << 20
	td := memorytest.Start(t, size, 0)
	c := dial(t, td.Addr, Options{ChunkSize: 256 << 10, QueueChunk: 48 << 10, BulkThreshold: 128 << 10})
	if c.Size() != size {
		t.Fatalf("size %d", c.Size())
	}
	shadow := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	pool := make([]byte, 4<<20)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(pool)
	ctx := context.Background()
	lengths := []int{1, 7, 64, 100, 4095, 4096, 4097, 65537, 300000, 1<<20 + 123, 3 << 20}
	for wi, wch := range channels {
		// Read back on the same channel and on the next one.
		for _, rch := range []Channel{wch, channels[(wi+1)%len(channels)]} {
			for _, n := range lengths {
				t.Run(fmt.Sprintf("%v-%v-%d", wch, rch, n), func(t *testing.T) {
					offs := []int64{0, int64(size - n), rng.Int64N(int64(size - n + 1))}
					for _, off := range offs {
						start := rng.IntN(len(pool) - n)
						p := pool[start : start+n]
						if err := c.Write(ctx, wch, p, off); err != nil {
							t.Fatalf("write %d@%d: %v", n, off, err)
						}
						copy(shadow[off:], p)
						// Read a window around the write to check neighbours too.
						lo, hi := max(off-13, 0), min(off+int64(n)+17, size)
						got := make([]byte, hi-lo)
						if err := c.Read(ctx, rch, got, lo); err != nil {
							t.Fatalf("read %d@%d: %v", len(got), lo, err)
						}
						if !bytes.Equal(got, shadow[lo:hi]) {
							t.Fatalf("mismatch after %v write / %v read of %d@%d", wch, rch, n, off)
						}
					}
				})
			}
		}
	}
	// Whole region over the bulk channel equals the shadow.
	all := make([]byte, size)
	if err := c.Read(ctx, ChannelBulk, all, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(all, shadow) {
		t.Fatal("region differs from shadow")
	}
}

func TestBoundsAndErrors(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 0)
	c := dial(t, td.Addr, Options{})
	ctx := context.Background()
	for _, ch := range channels {
		for _, tc := range []struct {
			off int64
			n   int
		}{{-1, 1}, {1 << 20, 1}, {1<<20 - 1, 2}, {0, 1<<20 + 1}} {
			err := c.Read(ctx, ch, make([]byte, tc.n), tc.off)
			if !errors.Is(err, protocol.ErrOutOfRange) {
				t.Errorf("%v read %d@%d: %v", ch, tc.n, tc.off, err)
			}
		}
	}
	// The client still works after refused requests.
	if err := c.Write(ctx, ChannelSync, []byte("ok"), 1<<20-2); err != nil {
		t.Fatal(err)
	}
	// io.ReaderAt semantics at the end.
	b := make([]byte, 4)
	n, err := c.ReadAt(b, 1<<20-2)
	if n != 2 || err == nil || string(b[:2]) != "ok" {
		t.Fatalf("ReadAt at end: %d %v %q", n, err, b[:n])
	}
}

func TestWrongCredentialAndSingleSubscriber(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 0)
	_, err := Dial(context.Background(), td.Addr, "not-the-credential", Options{})
	if !errors.Is(err, protocol.ErrAuth) {
		t.Fatalf("wrong credential: %v", err)
	}
	c := dial(t, td.Addr, Options{})
	if err := c.Write(context.Background(), ChannelSync, []byte("keep"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(context.Background(), td.Addr, testCred, Options{}); !errors.Is(err, protocol.ErrBusy) {
		t.Fatalf("second subscriber: %v", err)
	}
	_ = c.Close()
	// The session ends when the donor sees the control connection close.
	deadline := time.Now().Add(5 * time.Second)
	var c2 *Client
	for {
		c2, err = Dial(context.Background(), td.Addr, testCred, Options{})
		if err == nil || !errors.Is(err, protocol.ErrBusy) || time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
	}
	if err != nil {
		t.Fatalf("resubscribe: %v", err)
	}
	defer c2.Close()
	b := make([]byte, 4)
	if err := c2.Read(context.Background(), ChannelSync, b, 0); err != nil || string(b) != "keep" {
		t.Fatalf("contents after resubscribe: %q %v", b, err)
	}
}

func TestConcurrentUsers(t *testing.T) {
	const size, users = 4 << 20, 8
	td := memorytest.Start(t, size, 8)
	c := dial(t, td.Addr, Options{ChunkSize: 64 << 10})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, users)
	part := int64(size / users)
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(u), 9))
			base := int64(u) * part
			shadow := make([]byte, part)
			for i := range 60 {
				n := []int{64, 512, 4096, 20000, 200000}[rng.IntN(5)]
				off := rng.Int64N(part - int64(n))
				p := make([]byte, n)
				_, _ = rand.NewChaCha8([32]byte{byte(u), byte(i)}).Read(p)
				if err := c.Write(ctx, channels[i%4], p, base+off); err != nil {
					errs <- err
					return
				}
				copy(shadow[off:], p)
				got := make([]byte, n)
				if err := c.Read(ctx, channels[(i+1)%4], got, base+off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, shadow[off:off+int64(n)]) {
					errs <- fmt.Errorf("user %d: mismatch at %d", u, off)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestQueuePairCredits(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 4)
	c := dial(t, td.Addr, Options{})
	ctx := context.Background()
	q, err := c.NewQueuePair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if q.Credits() != 4 {
		t.Fatalf("initial credits %d", q.Credits())
	}
	const ops = 200
	bufs := make([][]byte, ops)
	go func() {
		for i := range ops {
			bufs[i] = bytes.Repeat([]byte{byte(i)}, 100)
			if _, err := q.Post(ctx, Op{Write: true, Off: int64(i * 100), Buf: bufs[i], Tag: uint64(i)}); err != nil {
				t.Error(err)
				return
			}
			if cr := q.Credits(); cr < 0 || cr > 4 {
				t.Errorf("credits %d", cr)
			}
		}
	}()
	seen := map[uint64]bool{}
	for len(seen) < ops {
		cpl := <-q.Completions()
		if cpl.Err != nil {
			t.Fatal(cpl.Err)
		}
		seen[cpl.Tag] = true
	}
	got := make([]byte, ops*100)
	if err := c.Read(ctx, ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range ops {
		if got[i*100] != byte(i) || got[i*100+99] != byte(i) {
			t.Fatalf("op %d not applied", i)
		}
	}
}

// A donor in a child process (memorytest.StartChild) is this test binary
// re-executed.
func TestMain(m *testing.M) {
	memorytest.RunChildIfAsked()
	os.Exit(m.Run())
}

func TestDonorKilledMidRequest(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGKILL} {
		for _, ch := range []Channel{ChannelSync, ChannelBulk, ChannelQueue} {
			t.Run(fmt.Sprintf("%v-%v", sig, ch), func(t *testing.T) {
				cmd, addr := memorytest.StartChild(t)
				c := dial(t, addr, Options{Timeout: 700 * time.Millisecond})
				ctx := context.Background()
				buf := make([]byte, 32<<20)
				if err := c.Read(ctx, ch, buf[:4096], 0); err != nil {
					t.Fatal(err)
				}
				res := make(chan error, 1)
				started := make(chan struct{})
				go func() {
					close(started)
					var err error
					for err == nil {
						err = c.Read(ctx, ch, buf, 0)
					}
					res <- err
				}()
				<-started
				if err := cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-res:
					if !errors.Is(err, protocol.ErrDonorLost) {
						t.Fatalf("error %v, want protocol.ErrDonorLost", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("request hung after the donor died")
				}
				if sig == syscall.SIGSTOP {
					_ = cmd.Process.Signal(syscall.SIGKILL)
				}
			})
		}
	}
}

// The fine-grained channel allocates nothing per request.
func TestSyncNoAllocs(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 0)
	c := dial(t, td.Addr, Options{})
	buf := make([]byte, 4096)
	ctx := context.Background()
	for _, ch := range []Channel{ChannelSync, ChannelAdaptive} {
		r := testing.AllocsPerRun(100, func() { _ = c.Read(ctx, ch, buf, 4096) })
		w := testing.AllocsPerRun(100, func() { _ = c.Write(ctx, ch, buf[:64], 64) })
		if r != 0 || w != 0 {
			t.Errorf("%v: %.1f allocations per read, %.1f per write", ch, r, w)
		}
	}
}

// TestRawDescriptorsOffNetpoller: the sockets the sync and bulk
// connections are driven on with raw syscalls are registered with no epoll
// instance of the process (the Go netpoller's among them) under any
// descriptor, since every segment arriving would otherwise wake its idle
// thread (docs/memory-protocol.md). The donor's end is checked by the
// donor's test of the same name.
func TestRawDescriptorsOffNetpoller(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 0)
	c := dial(t, td.Addr, Options{})
	if err := c.Read(context.Background(), ChannelBulk, make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	fds := map[int]string{c.sync.pg.Load().Fd(): "client sync"}
	for i, s := range c.streams {
		fds[s.pg.Load().Fd()] = fmt.Sprintf("client bulk stream %d", i)
	}
	if want := 1 + len(c.streams); len(fds) != want {
		t.Fatalf("%d raw descriptors, want %d (sync and each bulk stream)", len(fds), want)
	}
	memorytest.CheckOffNetpoller(t, fds)
}
