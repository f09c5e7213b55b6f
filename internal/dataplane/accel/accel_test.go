package accel

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
)

// memTarget is a Target with flat memory and two entries: "echo" and
// "block" (which waits for release to be closed).
type memTarget struct {
	mu      sync.Mutex
	mem     []byte
	release chan struct{}
	// stubborn, if set, is what "stubborn" waits for, whatever its
	// context says (a role with no cancellation point).
	stubborn chan struct{}
	// blocked counts "block" calls under way; interrupted those that
	// ended because their context did.
	blocked, interrupted atomic.Int64
}

func (t *memTarget) Authenticate(c []byte) error {
	if subtle.ConstantTimeCompare(c, []byte("lease-secret")) != 1 {
		return ErrAuth
	}
	return nil
}

func (t *memTarget) Info() Info {
	return Info{MemSize: uint64(len(t.mem)), Role: "test", Entries: []string{"block", "echo", "stubborn"}}
}

func (t *memTarget) WriteMem(addr uint64, p []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if addr > uint64(len(t.mem)) || uint64(len(p)) > uint64(len(t.mem))-addr {
		return fmt.Errorf("%w: [%d,+%d)", ErrOutOfRange, addr, len(p))
	}
	copy(t.mem[addr:], p)
	return nil
}

func (t *memTarget) ReadMem(addr uint64, n uint32) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if addr > uint64(len(t.mem)) || uint64(n) > uint64(len(t.mem))-addr {
		return nil, fmt.Errorf("%w: [%d,+%d)", ErrOutOfRange, addr, n)
	}
	return append([]byte(nil), t.mem[addr:addr+uint64(n)]...), nil
}

func (t *memTarget) Execute(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	switch entry {
	case "echo":
		return ins, nil
	case "stubborn":
		<-t.stubborn
		return nil, ctx.Err()
	case "block":
		t.blocked.Add(1)
		defer t.blocked.Add(-1)
		select {
		case <-t.release:
			return ins, nil
		case <-ctx.Done():
			t.interrupted.Add(1)
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("%w %q", roles.ErrUnknownEntry, entry)
}

func startServer(t *testing.T, tgt Target, mo int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &Server{Target: tgt, MaxOutstanding: mo, MaxPayload: 1 << 20}
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) *Conn {
	t.Helper()
	c, err := Dial(context.Background(), addr, []byte("lease-secret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestMailbox(t *testing.T) {
	tgt := &memTarget{mem: make([]byte, 1<<16), release: make(chan struct{})}
	addr := startServer(t, tgt, 8)
	ctx := context.Background()

	if _, err := Dial(ctx, addr, []byte("wrong")); !errors.Is(err, ErrAuth) {
		t.Fatalf("bad credential: %v", err)
	}
	c := dial(t, addr)
	if info := c.Info(); info.MemSize != 1<<16 || info.Role != "test" || info.MaxPayload != 1<<20 {
		t.Fatalf("info %+v", info)
	}
	in := []byte("hello mailbox")
	if err := c.WriteMem(ctx, 100, in); err != nil {
		t.Fatal(err)
	}
	for _, polled := range []bool{false, true} {
		task, err := c.Start(ctx, TaskSpec{Entry: "echo", In: 100, InLen: uint32(len(in)), Out: 4096, OutCap: 64, Polled: polled})
		if err != nil {
			t.Fatal(err)
		}
		n, err := task.Wait(ctx)
		if err != nil || n != uint32(len(in)) {
			t.Fatalf("polled=%v wait: %d %v", polled, n, err)
		}
		got, err := c.ReadMem(ctx, 4096, n)
		if err != nil || !bytes.Equal(got, in) {
			t.Fatalf("read back %q %v", got, err)
		}
	}
	if out, err := c.Mailbox(ctx, "echo", []byte("pipelined"), 200, 300, 64); err != nil || string(out) != "pipelined" {
		t.Fatalf("mailbox %q %v", out, err)
	}
	if _, err := c.Mailbox(ctx, "echo", []byte("x"), 1<<16, 300, 64); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("mailbox out of range: %v", err)
	}
	out, err := c.Call(ctx, "echo", []byte("inline"))
	if err != nil || string(out) != "inline" {
		t.Fatalf("call %q %v", out, err)
	}
	outs, err := c.CallBatch(ctx, "echo", [][]byte{[]byte("a"), nil, []byte("ccc")})
	if err != nil || len(outs) != 3 || string(outs[2]) != "ccc" || len(outs[1]) != 0 {
		t.Fatalf("batch %q %v", outs, err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	// Bad requests come back as typed errors and leave the connection usable.
	for _, tc := range []struct {
		name string
		do   func() error
		want error
	}{
		{"write past the end", func() error { return c.WriteMem(ctx, 1<<16-2, []byte("abc")) }, ErrOutOfRange},
		{"read past the end", func() error { _, err := c.ReadMem(ctx, 1<<62, 1); return err }, ErrOutOfRange},
		{"read too large", func() error { _, err := c.ReadMem(ctx, 0, 2<<20); return err }, ErrTooLarge},
		{"unknown entry", func() error { _, err := c.Call(ctx, "nope", nil); return err }, roles.ErrUnknownEntry},
		{"output too small", func() error {
			task, err := c.Start(ctx, TaskSpec{Entry: "echo", In: 100, InLen: uint32(len(in)), Out: 4096, OutCap: 2})
			if err != nil {
				return err
			}
			_, err = task.Wait(ctx)
			return err
		}, ErrOutputTooSmall},
		{"input out of range", func() error {
			task, err := c.Start(ctx, TaskSpec{Entry: "echo", In: 1 << 16, InLen: 1, Out: 0, OutCap: 2, Polled: true})
			if err != nil {
				return err
			}
			_, err = task.Wait(ctx)
			return err
		}, ErrOutOfRange},
		{"frame too large", func() error { _, err := c.Call(ctx, "echo", make([]byte, 2<<20)); return err }, ErrTooLarge},
	} {
		if err := tc.do(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestManyOutstanding(t *testing.T) {
	tgt := &memTarget{mem: make([]byte, 1024), release: make(chan struct{})}
	addr := startServer(t, tgt, 8)
	ctx := context.Background()
	c := dial(t, addr)
	// Eight tasks block in the target; the ninth is refused; releasing
	// them completes all eight, out of order with respect to each other.
	var tasks []*Task
	for i := 0; i < 8; i++ {
		task, err := c.Start(ctx, TaskSpec{Entry: "block", In: 0, InLen: 4, Out: 512, OutCap: 4})
		if err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, task)
	}
	// The 9th START is refused with ErrBusy until the others finish. The
	// server handles frames in order, so a PING after it proves the 8 are
	// admitted.
	t9, err := c.Start(ctx, TaskSpec{Entry: "block", In: 0, InLen: 4, Out: 512, OutCap: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := t9.Wait(ctx); !errors.Is(err, ErrBusy) {
		t.Fatalf("9th task: %v", err)
	}
	close(tgt.release)
	for _, task := range tasks {
		if n, err := task.Wait(ctx); err != nil || n != 4 {
			t.Fatalf("task %d: %d %v", task.ID(), n, err)
		}
	}
	// Concurrent inline calls from many goroutines on one connection.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				msg := []byte(fmt.Sprintf("g%d-i%d", g, i))
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				out, err := c.Call(cctx, "echo", msg)
				cancel()
				if errors.Is(err, ErrBusy) {
					continue
				}
				if err != nil || !bytes.Equal(out, msg) {
					errs <- fmt.Errorf("%s: %q %v", msg, out, err)
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

func TestCloseFailsPending(t *testing.T) {
	tgt := &memTarget{mem: make([]byte, 64), release: make(chan struct{})}
	addr := startServer(t, tgt, 8)
	c := dial(t, addr)
	task, err := c.Start(context.Background(), TaskSpec{Entry: "block", InLen: 1, OutCap: 1})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, err := task.Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait after close: %v", err)
	}
	if _, err := c.Call(context.Background(), "echo", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after close: %v", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, Frame{Op: OpStart, Flags: FlagInline | FlagNotify, Tag: 7,
		Payload: AppendStart(nil, Start{Entry: "echo", Payload: []byte("x")})}))
	f.Add(AppendFrame(nil, Frame{Op: OpHello, Payload: []byte{1, 0, 3, 0, 'a', 'b', 'c'}}))
	f.Add(AppendFrame(nil, Frame{Op: OpReady, Payload: appendInfo(nil, Info{Version: 1, Role: "r", Entries: []string{"a"}})}))
	f.Add(EncodeBatch([][]byte{[]byte("a"), []byte("bc")}))
	f.Add([]byte{255, 255, 255, 255, 1})
	f.Add(AppendFrame(nil, Frame{Op: OpCancel, Tag: 8, Payload: AppendCancel(nil, 7)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ReadFrame(bytes.NewReader(b), 1<<16)
		if err != nil {
			return
		}
		if re := AppendFrame(nil, fr); !bytes.Equal(re, b[:len(re)]) {
			t.Fatalf("re-encoding differs")
		}
		_, _ = ParseHello(fr.Payload)
		if id, err := ParseCancel(fr.Payload); err == nil && !bytes.Equal(AppendCancel(nil, id), fr.Payload) {
			t.Fatalf("cancel round trip differs")
		}
		_, _ = ParseInfo(fr.Payload)
		if s, err := ParseStart(fr.Payload, fr.Flags); err == nil {
			if fr.Flags&FlagInline != 0 {
				if got := AppendStart(nil, s); !bytes.Equal(got, fr.Payload) {
					t.Fatalf("start round trip differs")
				}
			}
		}
		if items, err := DecodeBatch(fr.Payload); err == nil {
			if !bytes.Equal(EncodeBatch(items), fr.Payload) {
				t.Fatalf("batch round trip differs")
			}
		}
	})
}

// FuzzServerConn feeds arbitrary frames to a server after a valid HELLO:
// it must neither panic nor hang.
func FuzzServerConn(f *testing.F) {
	start := AppendFrame(nil, Frame{Op: OpStart, Flags: FlagNotify, Tag: 2,
		Payload: AppendStart(nil, Start{Entry: "echo", In: 0, InLen: 4, Out: 8, OutCap: 8})})
	f.Add(start)
	f.Add(AppendFrame(nil, Frame{Op: OpWrite, Tag: 1, Payload: []byte{0, 0, 0, 0, 0, 0, 0, 0, 'x'}}))
	f.Add(AppendFrame(nil, Frame{Op: OpPoll, Tag: 3, Payload: []byte{2, 0, 0, 0}}))
	f.Add(append(AppendFrame(nil, Frame{Op: OpStart, Flags: FlagNotify | FlagInline, Tag: 5,
		Payload: AppendStart(nil, Start{Entry: "block", Payload: []byte("z")})}),
		AppendFrame(nil, Frame{Op: OpCancel, Tag: 6, Payload: AppendCancel(nil, 5)})...))
	f.Add(AppendFrame(nil, Frame{Op: OpCancel, Tag: 6, Payload: []byte{5, 0, 0}}))
	f.Add(AppendFrame(nil, Frame{Op: OpStart, Flags: FlagBatch | FlagInline, Tag: 4,
		Payload: AppendStart(nil, Start{Entry: "echo", Payload: EncodeBatch([][]byte{[]byte("q")})})}))
	f.Fuzz(func(t *testing.T, b []byte) {
		tgt := &memTarget{mem: make([]byte, 256), release: make(chan struct{})}
		close(tgt.release)
		s := &Server{Target: tgt, MaxPayload: 1 << 12}
		cli, srv := net.Pipe()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done := make(chan struct{})
		go func() { defer close(done); s.ServeConn(ctx, srv) }()
		go func() { _, _ = io.Copy(io.Discard, cli) }()
		hello := binary.LittleEndian.AppendUint16(nil, Version)
		hello = binary.LittleEndian.AppendUint16(hello, 12)
		hello = append(hello, "lease-secret"...)
		_, _ = cli.Write(AppendFrame(nil, Frame{Op: OpHello, Payload: hello}))
		_, _ = cli.Write(b)
		_ = cli.Close()
		<-done
	})
}

func TestReadFrameLarge(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 3<<20)
	b := AppendFrame(nil, Frame{Op: OpWrite, Tag: 9, Payload: big})
	f, err := ReadFrame(bytes.NewReader(b), 4<<20)
	if err != nil || !bytes.Equal(f.Payload, big) || f.Tag != 9 {
		t.Fatalf("large frame: %v", err)
	}
	// An announced length with no bytes behind it fails without
	// allocating the announced size up front.
	if _, err := ReadFrame(bytes.NewReader(b[:HeaderSize+10]), 4<<20); !errors.Is(err, ErrFrame) {
		t.Fatalf("truncated large frame: %v", err)
	}
	if _, err := ReadFrame(bytes.NewReader(b), 1<<20); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(EncodeBatch(nil))
	f.Add(EncodeBatch([][]byte{[]byte("a"), nil, []byte("ccc")}))
	f.Add([]byte{255, 255, 255, 255})
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		items, err := DecodeBatch(b)
		if err != nil {
			return
		}
		if !bytes.Equal(EncodeBatch(items), b) {
			t.Fatal("round trip differs")
		}
	})
}

func TestPolledTaskStates(t *testing.T) {
	tgt := &memTarget{mem: make([]byte, 64), release: make(chan struct{})}
	addr := startServer(t, tgt, 4)
	c := dial(t, addr)
	ctx := context.Background()
	task, err := c.Start(ctx, TaskSpec{Entry: "block", In: 0, InLen: 8, Out: 16, OutCap: 8, Polled: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := task.Poll(ctx)
	if err != nil || st.State != StateRunning {
		t.Fatalf("poll while blocked: %+v %v", st, err)
	}
	close(tgt.release)
	if n, err := task.Wait(ctx); err != nil || n != 8 {
		t.Fatalf("wait: %d %v", n, err)
	}
	// Reported once, then forgotten.
	if _, err := task.Poll(ctx); !errors.Is(err, ErrUnknownTask) {
		t.Fatalf("poll after done: %v", err)
	}
	failing, err := c.Start(ctx, TaskSpec{Entry: "nope", InLen: 1, OutCap: 1, Polled: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failing.Wait(ctx); !errors.Is(err, roles.ErrUnknownEntry) {
		t.Fatalf("failed polled task: %v", err)
	}
}
