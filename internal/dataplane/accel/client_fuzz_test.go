package accel

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// FuzzClientConn is a target (or anything on its address) answering a
// client with arbitrary frames: after the HELLO (a READY built from the
// fuzzed info, or the fuzzed bytes themselves), each frame the client
// sends is answered with the next frame of the input, carrying the
// request's tag unless it names one (0: the request's); what does not
// parse as a frame is sent raw, and the connection closed. Frames for
// other tags go out before the request's answer. The client
// runs a ping, a read, an inline call, a batch call, and a polled and a
// pushed task. Nothing panics or hangs; every failure wraps ErrFrame,
// ErrClosed, ErrTooLarge or is the target's RemoteError; a read returns
// the bytes asked for, a batch one output per input.
func FuzzClientConn(f *testing.F) {
	ok := func(tag uint32) []byte { return AppendFrame(nil, Frame{Op: OpOK, Tag: tag}) }
	done := func(p []byte) []byte {
		return AppendFrame(nil, Frame{Op: OpDone, Payload: append([]byte{byte(len(p)), 0, 0, 0}, p...)})
	}
	status := func(state uint8, n uint32) []byte {
		return AppendFrame(nil, Frame{Op: OpStatus, Payload: []byte{state, byte(n), 0, 0, 0}})
	}
	errf := AppendFrame(nil, Frame{Op: OpError, Payload: append([]byte{byte(CodeBadInput), 0}, "no"...)})
	ready := appendInfo(nil, Info{Version: Version, MemSize: 1 << 20, MaxPayload: 1 << 16, Role: "echo", Entries: []string{"echo"}})
	f.Add(ready, bytes.Join([][]byte{ok(0), AppendFrame(nil, Frame{Op: OpData, Payload: make([]byte, 8)}), done([]byte("x")),
		done(EncodeBatch([][]byte{[]byte("a"), []byte("b")})), ok(0), status(StateDone, 3), ok(0), done(nil)}, nil))
	f.Add(ready, bytes.Join([][]byte{errf, AppendFrame(nil, Frame{Op: OpData, Payload: make([]byte, 3)}), errf,
		done(EncodeBatch([][]byte{[]byte("a")})), ok(0), status(StateFailed, 0), errf}, nil))
	f.Add(ready, bytes.Join([][]byte{ok(99), AppendFrame(nil, Frame{Op: OpDone, Payload: []byte{1}}), status(9, 0)}, nil))
	f.Add([]byte{0, 0}, []byte(nil))
	f.Add(ready, []byte{0xff, 0xff, 0xff, 0x7f, 1, 2, 3})
	f.Fuzz(func(t *testing.T, info, replies []byte) {
		cli, srv := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			defer srv.Close()
			if _, err := ReadFrame(srv, 1<<20); err != nil {
				return
			}
			if _, err := srv.Write(AppendFrame(nil, Frame{Op: OpReady, Payload: info})); err != nil {
				return
			}
			rd := bytes.NewReader(replies)
			for rd.Len() > 0 {
				req, err := ReadFrame(srv, 1<<20)
				if err != nil {
					return
				}
				// Frames for other tags go out first; the request's
				// answer ends the turn.
				for answered := false; !answered; {
					off := len(replies) - rd.Len()
					fr, err := ReadFrame(rd, 1<<20)
					if err != nil {
						_, _ = srv.Write(replies[off:])
						return
					}
					if fr.Tag == 0 {
						fr.Tag = req.Tag
					}
					answered = fr.Tag == req.Tag
					if _, err := srv.Write(AppendFrame(nil, fr)); err != nil {
						return
					}
				}
			}
		}()
		defer func() { _ = cli.Close(); <-served }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		check := func(what string, err error) {
			t.Helper()
			var re *RemoteError
			if err == nil || errors.Is(err, ErrFrame) || errors.Is(err, ErrClosed) || errors.Is(err, ErrTooLarge) || errors.As(err, &re) {
				return
			}
			t.Fatalf("%s: %v", what, err)
		}
		c, err := NewConn(ctx, cli, []byte("lease-secret"))
		if err != nil {
			check("hello", err)
			return
		}
		defer c.Close()
		check("ping", c.Ping(ctx))
		b, err := c.ReadMem(ctx, 0, 8)
		check("read", err)
		if err == nil && len(b) != 8 {
			t.Fatalf("read of 8 bytes returned %d", len(b))
		}
		_, err = c.Call(ctx, "echo", []byte("x"))
		check("call", err)
		outs, err := c.CallBatch(ctx, "echo", [][]byte{[]byte("a"), []byte("b")})
		check("batch", err)
		if err == nil && len(outs) != 2 {
			t.Fatalf("a batch of 2 returned %d outputs", len(outs))
		}
		for _, polled := range []bool{true, false} {
			task, err := c.Start(ctx, TaskSpec{Entry: "echo", In: 0, InLen: 1, Out: 8, OutCap: 8, Polled: polled})
			check("start", err)
			if err == nil {
				_, err = task.Wait(ctx)
				check("wait", err)
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the client hung")
		}
	})
}
