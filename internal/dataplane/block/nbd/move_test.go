package nbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
)

// blockingBackend makes every write wait for a token on gate while hold
// is set, counting the writes that wait.
type blockingBackend struct {
	*MemBackend
	hold    atomic.Bool
	gate    chan struct{}
	waiting atomic.Int32
}

func newBlockingBackend(size int64) *blockingBackend {
	return &blockingBackend{MemBackend: NewMemBackend(size), gate: make(chan struct{}, 16)}
}

func (b *blockingBackend) WriteAt(p []byte, off int64) (int, error) {
	if b.hold.Load() {
		b.waiting.Add(1)
		<-b.gate
		b.waiting.Add(-1)
	}
	return b.MemBackend.WriteAt(p, off)
}

// at reads n bytes of the backend at off.
func (b *blockingBackend) at(off, n int64) []byte {
	p := make([]byte, n)
	b.MemBackend.ReadAt(p, off)
	return p
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// heldWrites counts the writes held at export name's gate.
func heldWrites(s *Server, name string) int {
	s.mu.Lock()
	e := s.exports[name]
	s.mu.Unlock()
	if e == nil {
		return -1
	}
	if g := e.writes.Gate(); g != nil {
		return g.Waiting()
	}
	return 0
}

func TestTrackWritesFile(t *testing.T) {
	const size = 4 << 20
	path := tempFile(t, size)
	be, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	s, addr := startServer(t, Export{Name: "x", Backend: be})
	c := dial(t, addr, "x")
	ctx := context.Background()
	d := dirty.New(size, 4096)
	if err := s.TrackWrites(ctx, "nope", d); !errors.Is(err, ErrExportNotFound) {
		t.Errorf("TrackWrites of an unknown export: %v", err)
	}
	if err := s.TrackWrites(ctx, "x", dirty.New(size/2, 4096)); err == nil {
		t.Error("a dirty map of the wrong size was accepted")
	}
	if _, err := c.WriteAt(make([]byte, 4096), 0); err != nil { // before: not marked
		t.Fatal(err)
	}
	if err := s.TrackWrites(ctx, "x", d); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte{7}, 256<<10) // large enough to be spliced without a move
	if _, err := c.WriteAt(big, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := c.Trim(2<<20, 8192); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteZeroes(3<<20, 4096, true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadAt(make([]byte, 4096), 5*4096); err != nil { // reads are not marked
		t.Fatal(err)
	}
	want := []dirty.Range{{Off: 1 << 20, Len: 256 << 10}, {Off: 2 << 20, Len: 8192}, {Off: 3 << 20, Len: 4096}}
	if got := d.Take(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("dirty = %v, want %v", got, want)
	}
	got := make([]byte, len(big))
	if _, err := be.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, big) {
		t.Errorf("the tracked write did not land: %v", err)
	}
	if err := s.EndMove("x"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt(big, 0); err != nil {
		t.Fatal(err)
	}
	if got := d.Take(); len(got) != 0 {
		t.Errorf("marked after EndMove: %v", got)
	}
}

func TestPauseWrites(t *testing.T) {
	be := newBlockingBackend(1 << 20)
	s, addr := startServer(t, Export{Name: "x", Backend: be})
	c := dial(t, addr, "x")
	ctx := context.Background()
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	write := func(b byte, off int64) chan error {
		ch := make(chan error, 1)
		go func() {
			_, err := c.WriteAt(bytes.Repeat([]byte{b}, 4096), off)
			ch <- err
		}()
		return ch
	}

	// A write under way before tracking starts: TrackWrites waits for it.
	be.hold.Store(true)
	w1 := write(1, 0)
	waitFor(t, "the first write to reach the backend", func() bool { return be.waiting.Load() == 1 })
	d := dirty.New(1<<20, 4096)
	if err := s.TrackWrites(short(), "x", d); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TrackWrites with an untracked write under way: %v, want the deadline", err)
	}
	be.gate <- struct{}{}
	if err := <-w1; err != nil {
		t.Fatal(err)
	}
	if err := s.TrackWrites(ctx, "x", d); err != nil {
		t.Fatal(err)
	}

	// A tracked write under way: PauseWrites waits for it, and gives up
	// (writes resumed) at its deadline.
	w2 := write(2, 4096)
	waitFor(t, "the second write to reach the backend", func() bool { return be.waiting.Load() == 1 })
	if err := s.PauseWrites(short(), "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PauseWrites with a write under way: %v, want the deadline", err)
	}
	be.gate <- struct{}{}
	if err := <-w2; err != nil {
		t.Fatal(err)
	}
	be.hold.Store(false)
	if got := d.Take(); fmt.Sprint(got) != fmt.Sprint([]dirty.Range{{Off: 4096, Len: 4096}}) {
		t.Errorf("dirty after the second write: %v", got)
	}

	// Paused: a new write waits at the gate and has not reached the
	// backend; resumed, it lands and is marked.
	if err := s.PauseWrites(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	w3 := write(3, 8192)
	waitFor(t, "the third write to be held", func() bool { return heldWrites(s, "x") == 1 })
	if !bytes.Equal(be.at(8192, 4096), make([]byte, 4096)) || len(d.Take()) != 0 {
		t.Fatal("a held write reached the backend")
	}
	// Reads are served while writes are held.
	if _, err := c.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("read while writes are paused: %v", err)
	}
	if err := s.ResumeWrites("x"); err != nil {
		t.Fatal(err)
	}
	if err := <-w3; err != nil {
		t.Fatal(err)
	}
	if be.at(8192, 1)[0] != 3 || fmt.Sprint(d.Take()) != fmt.Sprint([]dirty.Range{{Off: 8192, Len: 4096}}) {
		t.Error("the resumed write did not land or was not marked")
	}
}

func TestRetire(t *testing.T) {
	be := newBlockingBackend(1 << 20)
	s, addr := startServer(t, Export{Name: "x", Backend: be})
	busy := dial(t, addr, "x")
	held := dial(t, addr, "x")
	ctx := context.Background()
	if err := s.TrackWrites(ctx, "x", dirty.New(1<<20, 4096)); err != nil {
		t.Fatal(err)
	}
	// A write under way on one connection...
	be.hold.Store(true)
	w1 := make(chan error, 1)
	go func() {
		_, err := busy.WriteAt(bytes.Repeat([]byte{1}, 4096), 0)
		w1 <- err
	}()
	waitFor(t, "the write under way", func() bool { return be.waiting.Load() == 1 })
	// ...and, once writes are paused, one held on the other.
	paused := make(chan error, 1)
	go func() { paused <- s.PauseWrites(ctx, "x") }()
	waitFor(t, "the pause", func() bool {
		_, g, _ := s.move("x")
		return g.Paused()
	})
	w2 := make(chan error, 1)
	go func() {
		_, err := held.WriteAt(bytes.Repeat([]byte{2}, 4096), 8192)
		w2 <- err
	}()
	waitFor(t, "the held write", func() bool { return heldWrites(s, "x") == 1 })

	retired := make(chan error, 1)
	go func() { retired <- s.Retire(ctx, "x") }()
	// The held write is answered ESHUTDOWN, and its client is done.
	if err := <-w2; !errors.Is(err, ErrShutdown) || !errors.Is(err, ErrClosed) {
		t.Fatalf("held write: %v, want ESHUTDOWN", err)
	}
	var ne *Error
	if _, err := held.ReadAt(make([]byte, 512), 0); !errors.Is(err, ErrShutdown) || errors.As(err, &ne) {
		t.Errorf("a request after ESHUTDOWN: %v, want ErrShutdown without asking the server", err)
	}
	// No new connection reaches the export.
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if c, err := Dial(dctx, "tcp", addr, "x"); !errors.Is(err, ErrExportNotFound) {
		if c != nil {
			c.Close()
		}
		t.Errorf("dial of a retired export: %v", err)
	}
	// The write under way completes, is answered, and then Retire and
	// PauseWrites return.
	be.gate <- struct{}{}
	if err := <-w1; err != nil {
		t.Errorf("the write under way at Retire: %v", err)
	}
	if err := <-paused; err != nil {
		t.Errorf("PauseWrites: %v", err)
	}
	if err := <-retired; err != nil {
		t.Errorf("Retire: %v", err)
	}
	if be.at(0, 1)[0] != 1 || be.at(8192, 1)[0] != 0 {
		t.Error("the write under way did not land, or the held one did")
	}
	if _, err := busy.ReadAt(make([]byte, 512), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("a request on a retired export's connection: %v", err)
	}
	if err := s.Retire(ctx, "x"); !errors.Is(err, ErrExportNotFound) {
		t.Errorf("Retire twice: %v", err)
	}
}

// TestRetireLibnbd: a third-party client (libnbd) of a retired export
// gets ESHUTDOWN, then finds the connection closed.
func TestRetireLibnbd(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	if exec.Command("/usr/bin/python3", "-c", "import nbd").Run() != nil {
		t.Skip("python3-libnbd is not installed")
	}
	be := newBlockingBackend(1 << 20)
	s, addr := startServer(t, Export{Name: "x", Backend: be})
	ctx := context.Background()
	if err := s.PauseWrites(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	script := `
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
print("connected", flush=True)
try:
    h.pwrite(b"\x05" * 4096, 0)
    print("write ok")
except nbd.Error as e:
    print("write failed errno", e.errno)
try:
    h.pread(4096, 0)
    print("read ok")
except nbd.Error as e:
    print("read failed")
`
	cmd := exec.Command("/usr/bin/python3", "-c", script, "nbd://"+addr+"/x")
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "libnbd's write to be held", func() bool { return heldWrites(s, "x") == 1 })
	if err := s.Retire(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	want := "connected\nwrite failed errno ESHUTDOWN\nread failed\n"
	if out.String() != want {
		t.Errorf("libnbd saw:\n%s\nwant:\n%s", out, want)
	}
	if be.at(0, 1)[0] != 0 {
		t.Error("the held write reached the backend")
	}
}
