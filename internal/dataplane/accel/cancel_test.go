package accel

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling, not synchronisation
	}
}

// A caller whose context ends (its deadline, its cancellation) stops the
// task on the target: the target's execution sees its context end and the
// connection's task slot is free again.
func TestCallerDeadlineCancelsTask(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *Conn) error
	}{
		{"inline", func(ctx context.Context, c *Conn) error { _, err := c.Call(ctx, "block", []byte("x")); return err }},
		{"batch", func(ctx context.Context, c *Conn) error {
			_, err := c.CallBatch(ctx, "block", [][]byte{[]byte("a"), []byte("b")})
			return err
		}},
		{"polled", func(ctx context.Context, c *Conn) error {
			task, err := c.Start(ctx, TaskSpec{Entry: "block", InLen: 4, Out: 8, OutCap: 8, Polled: true})
			if err != nil {
				return err
			}
			_, err = task.Wait(ctx)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tgt := &memTarget{mem: make([]byte, 64), release: make(chan struct{})}
			// One task at a time: the next call is admitted only once the
			// cancelled one has left the server.
			addr := startServer(t, tgt, 1)
			c := dial(t, addr)
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- tc.call(ctx, c) }()
			waitUntil(t, "the task to run", func() bool { return tgt.blocked.Load() == 1 })
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("call: %v, want context.Canceled", err)
			}
			waitUntil(t, "the target's execution to stop", func() bool {
				return tgt.interrupted.Load() == 1 && tgt.blocked.Load() == 0
			})
			// The connection's only task slot is free again: a new call
			// runs. The server gives the slot back just after the
			// target's execution returns, so a call sent in between is
			// refused as busy (the slot still held): such a call is sent
			// again; any other failure, or a slot never given back, fails.
			var out []byte
			var err error
			waitUntil(t, "a call after the cancellation to be admitted", func() bool {
				out, err = c.Call(context.Background(), "echo", []byte("next"))
				return !errors.Is(err, ErrBusy)
			})
			if err != nil || !bytes.Equal(out, []byte("next")) {
				t.Fatalf("call after the cancellation: %q %v", out, err)
			}
		})
	}
}

// A deadline (not only a cancellation) stops the target's execution.
func TestCallerDeadlineExpiry(t *testing.T) {
	tgt := &memTarget{mem: make([]byte, 64), release: make(chan struct{})}
	addr := startServer(t, tgt, 1)
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Call(ctx, "block", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call: %v", err)
	}
	waitUntil(t, "the target's execution to stop", func() bool { return tgt.interrupted.Load() == 1 })
}

// CANCEL names a task of the connection: a running one is stopped and
// fails with code Canceled; an unknown or finished one is answered
// UnknownTask; a malformed payload is a frame error.
func TestCancelFrame(t *testing.T) {
	tgt := &memTarget{mem: make([]byte, 64), release: make(chan struct{})}
	addr := startServer(t, tgt, 4)
	c := dial(t, addr)
	ctx := context.Background()
	task, err := c.Start(ctx, TaskSpec{Entry: "block", InLen: 4, Out: 8, OutCap: 8})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the task to run", func() bool { return tgt.blocked.Load() == 1 })
	if err := task.Cancel(ctx); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	_, err = task.Wait(ctx)
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeCanceled || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled task: %v, want remote code %d", err, CodeCanceled)
	}
	if err := task.Cancel(ctx); !errors.Is(err, ErrUnknownTask) {
		t.Fatalf("second cancel: %v, want ErrUnknownTask", err)
	}
	if _, err := c.roundTrip(ctx, OpCancel, 0, []byte{1, 2}, OpOK); !errors.Is(err, ErrFrame) {
		t.Fatalf("short cancel: %v, want ErrFrame", err)
	}
	// The connection still serves.
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseCancel(f *testing.F) {
	f.Add(AppendCancel(nil, 7))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 4, 5})
	f.Fuzz(func(t *testing.T, p []byte) {
		id, err := ParseCancel(p)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("error %v is not ErrFrame", err)
			}
			return
		}
		if !bytes.Equal(AppendCancel(nil, id), p) {
			t.Fatalf("round trip differs")
		}
	})
}

// A settled call (a gateway's: it counts the slot free once the call has
// returned) whose context ends returns once the target has ended the task,
// and by then the server has given the task's slot back: the next call on
// the connection is admitted, never refused as busy. The server sent the
// task's final frame before giving its slot back, so a call sent at once
// could be refused in between.
func TestSettledCallFreesSlot(t *testing.T) {
	tgt := &memTarget{mem: make([]byte, 64), release: make(chan struct{})}
	addr := startServer(t, tgt, 1) // one task at a time
	c := dial(t, addr)
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.CallBatchSettled(ctx, "block", [][]byte{[]byte("a")}, 10*time.Second)
			errc <- err
		}()
		waitUntil(t, "the task to run", func() bool { return tgt.blocked.Load() == 1 })
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: settled call: %v, want context.Canceled", i, err)
		}
		out, err := c.Call(context.Background(), "echo", []byte("next"))
		if err != nil || !bytes.Equal(out, []byte("next")) {
			t.Fatalf("round %d: call after the settled cancellation: %q %v", i, out, err)
		}
	}
}

// A polled task cancelled while its role runs on (no cancellation point)
// does not touch a later task given the same tag: the new task is running
// until it ends, whatever the cancelled one does when it finally returns.
// The cancelled task's end marked the tag's current task done (with its
// own outcome) while the new one still ran. (The Go client never reuses a
// tag; other clients may.)
func TestCancelledTagReused(t *testing.T) {
	const mem = 1 << 20
	tgt := &memTarget{mem: make([]byte, 64), release: make(chan struct{}), stubborn: make(chan struct{})}
	srv := &Server{Target: tgt, MaxPayload: mem, MaxOutstanding: 2}
	nc, br := serveHello(t, srv, mem)
	exchange := func(f Frame) Frame {
		t.Helper()
		if _, err := nc.Write(AppendFrame(nil, f)); err != nil {
			t.Fatal(err)
		}
		r, err := ReadFrame(br, mem)
		if err != nil {
			t.Fatal(err)
		}
		if r.Tag != f.Tag {
			t.Fatalf("answer to tag %d: %+v", f.Tag, r)
		}
		return r
	}
	start := func(tag uint32, entry string) {
		t.Helper()
		r := exchange(Frame{Op: OpStart, Flags: FlagInline, Tag: tag, Payload: AppendStart(nil, Start{Entry: entry, Payload: []byte("x")})})
		if r.Op != OpAccepted {
			t.Fatalf("START %d %s: %+v", tag, entry, r)
		}
	}
	poll := func(tag uint32) byte {
		t.Helper()
		r := exchange(Frame{Op: OpPoll, Tag: 99, Payload: binary.LittleEndian.AppendUint32(nil, tag)})
		if r.Op != OpStatus || len(r.Payload) < 1 {
			t.Fatalf("POLL %d: %+v", tag, r)
		}
		return r.Payload[0]
	}
	start(5, "stubborn")
	if r := exchange(Frame{Op: OpCancel, Tag: 6, Payload: AppendCancel(nil, 5)}); r.Op != OpOK {
		t.Fatalf("CANCEL 5: %+v", r)
	}
	start(5, "block") // tag 5 again, a task that waits for release
	waitUntil(t, "the new task to run", func() bool { return tgt.blocked.Load() == 1 })
	close(tgt.stubborn) // the cancelled task returns
	// Its slot given back (with two slots, a third task is admitted
	// beside the new one only once the cancelled one has left), and a
	// task started after that has ended: the cancelled one's end has been
	// handled by then.
	waitUntil(t, "the cancelled task's slot to be given back", func() bool {
		r := exchange(Frame{Op: OpStart, Flags: FlagInline, Tag: 7, Payload: AppendStart(nil, Start{Entry: "echo", Payload: []byte("y")})})
		return r.Op == OpAccepted
	})
	waitUntil(t, "the echo task to end", func() bool { return poll(7) == StateDone })
	if st := poll(5); st != StateRunning {
		t.Fatalf("tag 5's new task: state %d after the cancelled one ended, want running (%d)", st, StateRunning)
	}
	close(tgt.release)
	waitUntil(t, "the new task to end", func() bool { return poll(5) == StateDone })
}
