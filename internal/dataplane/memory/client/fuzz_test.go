package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// FuzzQueueReplies feeds arbitrary donor bytes to a queue pair's reply
// reader with a 64-byte read (seq 1) and a 64-byte write (seq 2) pending.
// The write's source is never written to, and an operation succeeds only
// when the first reply for its sequence number is the right one: an OK
// response of its opcode carrying, for the read, exactly the bytes asked
// for, which land in its buffer. A reply for neither fails both as a
// malformed frame.
func FuzzQueueReplies(f *testing.F) {
	reply := func(h protocol.Header, payload []byte) []byte {
		h.Flags, h.Payload = protocol.FlagResponse, uint32(len(payload))
		b := make([]byte, protocol.HeaderSize, protocol.HeaderSize+len(payload))
		h.Encode(b)
		return append(b, payload...)
	}
	data := bytes.Repeat([]byte{0x5a}, 64)
	f.Add(append(reply(protocol.Header{Op: protocol.OpWrite, Seq: 2, Length: 64}, nil), reply(protocol.Header{Op: protocol.OpRead, Seq: 1, Length: 64}, data)...))
	f.Add(reply(protocol.Header{Op: protocol.OpRead, Seq: 1, Status: protocol.StatusRange}, []byte("memory: out of range")))
	f.Add(append(reply(protocol.Header{Op: protocol.OpRead, Seq: 9, Length: 3}, []byte("abc")), reply(protocol.Header{Op: protocol.OpWrite, Seq: 2, Length: 64}, nil)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		srv, cli := net.Pipe()
		go func() {
			_, _ = srv.Write(in)
			_ = srv.Close()
		}()
		src := bytes.Repeat([]byte{0xc3}, 64)
		rd := &qop{op: Op{Buf: make([]byte, 64)}, seq: 1, done: make(chan error, 1)}
		wr := &qop{op: Op{Write: true, Buf: append([]byte(nil), src...)}, seq: 2, done: make(chan error, 1)}
		// A connection that ends is not re-established: there is no
		// donor to dial.
		refuse := func(context.Context, string) (net.Conn, error) { return nil, errors.New("no donor here") }
		q := &QueuePair{c: &Client{opts: Options{Timeout: 10 * time.Second, Dialer: refuse}}, conn: cli, br: bufio.NewReader(cli),
			wake: make(chan struct{}), pending: map[uint32]*qop{1: rd, 2: wr}, done: make(chan struct{}), settled: make(chan struct{})}
		q.reader(context.Background(), q.done)
		rerr, werr := <-rd.done, <-wr.done

		if !bytes.Equal(wr.op.Buf, src) {
			t.Fatal("a reply was written into the source of a write")
		}
		// The first complete reply for each sequence number, as long as
		// the frames before it are well formed.
		first := map[uint32][]byte{}
		for off := 0; off+protocol.HeaderSize <= len(in); {
			h, err := protocol.DecodeHeader(in[off : off+protocol.HeaderSize])
			end := off + protocol.HeaderSize + int(h.Payload)
			if err != nil || !h.IsResponse() || end > len(in) {
				break
			}
			if _, seen := first[h.Seq]; !seen {
				first[h.Seq] = in[off:end]
			}
			off = end
		}
		ok := func(seq uint32, op uint8, payload int) bool {
			fr := first[seq]
			if fr == nil {
				return false
			}
			h, _ := protocol.DecodeHeader(fr)
			return h.Op == op && h.Status == protocol.StatusOK && int(h.Payload) == payload
		}
		if rerr == nil && (!ok(1, protocol.OpRead, 64) || !bytes.Equal(rd.op.Buf, first[1][protocol.HeaderSize:])) {
			t.Fatalf("read succeeded without its reply: %x", first[1])
		}
		if werr == nil && !ok(2, protocol.OpWrite, 0) {
			t.Fatalf("write succeeded without its reply: %x", first[2])
		}
		// A first reply for neither request (none was given up) fails
		// both, at once, as a malformed frame.
		if len(in) >= protocol.HeaderSize {
			h, err := protocol.DecodeHeader(in[:protocol.HeaderSize])
			if err == nil && h.IsResponse() && (h.Op == protocol.OpRead || h.Op == protocol.OpWrite) && h.Seq != 1 && h.Seq != 2 &&
				(!errors.Is(rerr, protocol.ErrBadFrame) || !errors.Is(werr, protocol.ErrBadFrame)) {
				t.Fatalf("a reply for seq %d, which no request waits for: read %v, write %v", h.Seq, rerr, werr)
			}
		}
	})
}
