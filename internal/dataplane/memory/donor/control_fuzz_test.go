package donor

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// scriptConn is a connection whose peer sent in and then closed its
// side: the donor reads in (counting what it consumed) and then EOF, and
// what it writes is kept.
type scriptConn struct {
	in  *bytes.Reader
	mu  sync.Mutex
	out bytes.Buffer
}

func (c *scriptConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.in.Read(p)
}

func (c *scriptConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *scriptConn) consumed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.in.Size()) - c.in.Len()
}

func (c *scriptConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.out.Bytes()...)
}

func (*scriptConn) Close() error        { return nil }
func (*scriptConn) LocalAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7100} }
func (*scriptConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
func (*scriptConn) SetDeadline(time.Time) error      { return nil }
func (*scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (*scriptConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzControlStream sends arbitrary frames on a session's control
// connection after its HELLO. The donor answers each PING request with
// a PING response of its sequence number, in order; refuses the first
// other well-formed frame with StatusProto (naming its opcode and
// sequence number) and ends the connection; ends it silently at a
// malformed header or the end of the stream. It takes in the headers
// only — never a payload (a PING has none; whatever else comes is
// refused unread), so an authenticated peer cannot make it allocate one —
// and the session ends with the connection: the region takes a new
// subscriber, with its generation unchanged.
func FuzzControlStream(f *testing.F) {
	frames := seedFrames()
	f.Add(frames[3])                                       // PING
	f.Add(bytes.Join([][]byte{frames[3], frames[3]}, nil)) // two PINGs
	f.Add(bytes.Join([][]byte{frames[3], frames[2], frames[3]}, nil))
	f.Add(frames[1])                                            // READ request
	f.Add(frames[4])                                            // a CREDIT (response) sent to the donor
	f.Add(frames[0])                                            // a second HELLO
	f.Add(bytes.Join([][]byte{frames[3], frames[5][:40]}, nil)) // PING, then a truncated error response
	f.Add(frames[3][:protocol.HeaderSize-1])                    // a short header
	big := protocol.Header{Op: protocol.OpWrite, Seq: 9, Length: protocol.MaxPayload, Payload: protocol.MaxPayload}
	var hb [protocol.HeaderSize]byte
	big.Encode(hb[:])
	f.Add(bytes.Join([][]byte{frames[3], hb[:]}, nil)) // PING, then a 1 MiB WRITE's header alone
	f.Fuzz(func(t *testing.T, in []byte) {
		d := New(nil)
		if err := d.AddRegion(testCred, 8192); err != nil {
			t.Fatal(err)
		}
		defer d.RemoveRegion(testCred)
		gen, err := d.RegionGeneration(testCred)
		if err != nil {
			t.Fatal(err)
		}
		hello := frames[0]
		c := &scriptConn{in: bytes.NewReader(append(append([]byte(nil), hello...), in...))}
		d.handle(c) // returns once the connection ended

		out := c.written()
		const helloReply = protocol.HeaderSize + protocol.HelloReplySize
		if len(out) < helloReply {
			t.Fatalf("no HELLO reply: %x", out)
		}
		if h, err := protocol.DecodeHeader(out); err != nil || h.Op != protocol.OpHello || h.Status != protocol.StatusOK || h.Payload != protocol.HelloReplySize {
			t.Fatalf("HELLO reply %+v (%v)", h, err)
		}
		// What the donor must have answered and taken in.
		var want bytes.Buffer
		pos := 0
		for {
			if pos+protocol.HeaderSize > len(in) {
				pos = len(in) // a short header at the end, read up to EOF
				break
			}
			h, err := protocol.DecodeHeader(in[pos : pos+protocol.HeaderSize])
			pos += protocol.HeaderSize
			if err != nil {
				break
			}
			if h.Op == protocol.OpPing && !h.IsResponse() {
				r := protocol.Header{Op: protocol.OpPing, Flags: protocol.FlagResponse, Seq: h.Seq}
				var b [protocol.HeaderSize]byte
				r.Encode(b[:])
				want.Write(b[:])
				continue
			}
			_ = writeErr(&want, h.Op, h.Seq, protocol.StatusProto, "memory: only PING on the control connection")
			break
		}
		if got := out[helloReply:]; !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("control connection answered\n%x\nwant\n%x", got, want.Bytes())
		}
		if got := c.consumed() - len(hello); got != pos {
			t.Fatalf("the donor took in %d bytes of the control stream, want %d (headers only)", got, pos)
		}
		if g, err := d.RegionGeneration(testCred); err != nil || g != gen {
			t.Fatalf("the region's generation is %#x (%v), was %#x", g, err, gen)
		}
		// The session ended with its control connection: a new one opens.
		s, _, _, st, msg := d.attach(&scriptConn{in: bytes.NewReader(nil)}, protocol.Hello{Kind: protocol.KindControl, Credential: testCred}, protocol.Header{})
		if st != protocol.StatusOK {
			t.Fatalf("a new session after the control connection ended: %d %s", st, msg)
		}
		s.reg.users.Done()
		d.endSession(s)
	})
}
