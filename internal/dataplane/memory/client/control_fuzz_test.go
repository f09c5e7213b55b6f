package client

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// donorStream is a control connection on which the donor sent in and
// then closed its side.
type donorStream struct{ *bytes.Reader }

func (donorStream) Write(p []byte) (int, error)      { return len(p), nil }
func (donorStream) Close() error                     { return nil }
func (donorStream) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (donorStream) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (donorStream) SetDeadline(time.Time) error      { return nil }
func (donorStream) SetReadDeadline(time.Time) error  { return nil }
func (donorStream) SetWriteDeadline(time.Time) error { return nil }

// FuzzControlCredits feeds arbitrary donor bytes to a session's control
// connection reader, with queue pair 1 holding 64 credits. The queue's
// credits are exactly what the CREDIT updates for queue 1 say (an OK
// response whose offset is 1; later values supersede earlier ones, and a
// value behind the current one, modulo 2³², is ignored), read frame by
// frame up to the first malformed one; error responses and frames for
// other queues (an offset beyond 32 bits included) grant nothing. When
// the connection ends the session is lost: the client's error and the
// queue pair's wrap protocol.ErrDonorLost.
func FuzzControlCredits(f *testing.F) {
	frame := func(h protocol.Header, payload []byte) []byte {
		h.Flags, h.Payload = protocol.FlagResponse, uint32(len(payload))
		b := make([]byte, protocol.HeaderSize, protocol.HeaderSize+len(payload))
		h.Encode(b)
		return append(b, payload...)
	}
	credit := func(q uint64, v uint32) []byte {
		return frame(protocol.Header{Op: protocol.OpCredit, Offset: q, Credits: v}, nil)
	}
	f.Add(credit(1, 80))
	f.Add(bytes.Join([][]byte{credit(1, 80), credit(1, 70), credit(2, 500), credit(1, 96)}, nil))
	f.Add(bytes.Join([][]byte{frame(protocol.Header{Op: protocol.OpPing, Seq: 3}, nil), credit(1, 1<<31+70)}, nil))
	f.Add(bytes.Join([][]byte{frame(protocol.Header{Op: protocol.OpRead, Seq: 1, Length: 3}, []byte("abc")), credit(1, 65)}, nil))
	f.Add(credit(1<<32|1, 1000))
	f.Add(frame(protocol.Header{Op: protocol.OpCredit, Status: protocol.StatusCredit, Offset: 1, Credits: 1000}, []byte("memory: queue credit violated")))
	f.Add(credit(1, 80)[:20])
	f.Fuzz(func(t *testing.T, in []byte) {
		srv, cli := net.Pipe()
		defer srv.Close()
		c := &Client{opts: Options{Timeout: 10 * time.Second}, queues: map[uint32]*QueuePair{}, ctrl: donorStream{bytes.NewReader(in)}, ctrlDone: make(chan struct{})}
		q := &QueuePair{c: c, id: 1, conn: cli, granted: 64, wake: make(chan struct{}), pending: map[uint32]*qop{},
			done: make(chan struct{}), settled: make(chan struct{})}
		c.queues[1] = q
		c.readControl()

		want := uint32(64)
		for off := 0; off+protocol.HeaderSize <= len(in); {
			h, err := protocol.DecodeHeader(in[off : off+protocol.HeaderSize])
			end := off + protocol.HeaderSize + int(h.Payload)
			if err != nil || end > len(in) {
				break
			}
			if h.Op == protocol.OpCredit && h.Status == protocol.StatusOK && h.Offset == 1 && int32(h.Credits-want) > 0 {
				want = h.Credits
			}
			off = end
		}
		q.mu.Lock()
		got, qerr := q.granted, q.err
		q.mu.Unlock()
		if got != want {
			t.Fatalf("queue 1 holds %d credits, the updates granted %d", got, want)
		}
		if err := c.err(); !errors.Is(err, protocol.ErrDonorLost) {
			t.Fatalf("session error after the control connection ended: %v", err)
		}
		if !errors.Is(qerr, protocol.ErrDonorLost) {
			t.Fatalf("queue pair error after the control connection ended: %v", qerr)
		}
	})
}
