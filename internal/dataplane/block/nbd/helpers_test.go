package nbd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/logtest"
)

// startServer serves exports on a loopback port until the test ends.
func startServer(t testing.TB, exports ...Export) (*Server, string) {
	t.Helper()
	s := &Server{}
	for _, e := range exports {
		if err := s.AddExport(e); err != nil {
			t.Fatal(err)
		}
	}
	return s, serveOn(t, s)
}

func serveOn(t testing.TB, s *Server) string {
	t.Helper()
	return serveLn(t, s, listen(t))
}

// serveLn serves s on ln until the test ends and returns ln's address.
func serveLn(t testing.TB, s *Server, ln net.Listener) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return after cancel")
		}
	})
	return ln.Addr().String()
}

func dial(t testing.TB, addr, name string, opts ...DialOption) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "tcp", addr, name, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawConn speaks the protocol byte by byte, for error-path tests.
type rawConn struct {
	t testing.TB
	c net.Conn
	r *bufio.Reader
}

func rawDial(t testing.TB, addr string, cflags uint32) *rawConn {
	t.Helper()
	return rawDialNet(t, "tcp", addr, cflags)
}

// rawDialNet is rawDial on network ("tcp" or "unix").
func rawDialNet(t testing.TB, network, addr string, cflags uint32) *rawConn {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	rc := &rawConn{t: t, c: c, r: bufio.NewReader(c)}
	var g [18]byte
	if _, err := io.ReadFull(rc.r, g[:]); err != nil {
		t.Fatal(err)
	}
	if binary.BigEndian.Uint64(g[:]) != nbdMagic || binary.BigEndian.Uint64(g[8:]) != optMagic {
		t.Fatalf("bad greeting %x", g)
	}
	var f [4]byte
	binary.BigEndian.PutUint32(f[:], cflags)
	rc.write(f[:])
	return rc
}

func (rc *rawConn) write(b []byte) {
	rc.t.Helper()
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatal(err)
	}
}

func (rc *rawConn) opt(opt uint32, data []byte) {
	rc.t.Helper()
	b := binary.BigEndian.AppendUint64(nil, optMagic)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	rc.write(append(b, data...))
}

func (rc *rawConn) optReply() (opt, typ uint32, data []byte, err error) {
	var h [20]byte
	if _, err := io.ReadFull(rc.r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	if binary.BigEndian.Uint64(h[:]) != optReplyMagic {
		rc.t.Fatalf("bad option reply magic %x", h)
	}
	data = make([]byte, binary.BigEndian.Uint32(h[16:]))
	_, err = io.ReadFull(rc.r, data)
	return binary.BigEndian.Uint32(h[8:]), binary.BigEndian.Uint32(h[12:]), data, err
}

// optExpect sends an option and returns the reply types up to the final one.
func (rc *rawConn) optExpect(opt uint32, data []byte) []uint32 {
	rc.t.Helper()
	rc.opt(opt, data)
	var types []uint32
	for {
		o, typ, _, err := rc.optReply()
		if err != nil {
			rc.t.Fatalf("option %d: %v", opt, err)
		}
		if o != opt {
			rc.t.Fatalf("reply for option %d, want %d", o, opt)
		}
		types = append(types, typ)
		if typ == repAck || typ&repErrBit != 0 {
			return types
		}
	}
}

func infoData(name string, infos ...uint16) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

func metaData(name string, queries ...string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(queries)))
	for _, q := range queries {
		b = binary.BigEndian.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

// goTransmission negotiates and enters transmission on export name.
func (rc *rawConn) goTransmission(name string, structured, meta bool) {
	rc.t.Helper()
	if structured {
		if got := rc.optExpect(optStructuredReply, nil); got[len(got)-1] != repAck {
			rc.t.Fatalf("structured reply: %x", got)
		}
	}
	if meta {
		if got := rc.optExpect(optSetMetaContext, metaData(name, MetaContextBaseAllocation)); got[len(got)-1] != repAck || len(got) != 2 {
			rc.t.Fatalf("set meta: %x", got)
		}
	}
	if got := rc.optExpect(optGo, infoData(name, infoBlockSize)); got[len(got)-1] != repAck {
		rc.t.Fatalf("go: %x", got)
	}
}

func (rc *rawConn) request(r Request, payload []byte) {
	rc.t.Helper()
	b := make([]byte, requestHeaderLen, requestHeaderLen+len(payload))
	putRequest(b, r)
	rc.write(append(b, payload...))
}

type rawReply struct {
	handle uint64
	errno  uint32
	data   []byte // read data or block-status payload
	chunks []uint16
}

// reply reads one complete reply; readLen is the data length of a simple
// read reply (0 for other commands).
func (rc *rawConn) reply(readLen int) (rawReply, error) {
	var h [20]byte
	if _, err := io.ReadFull(rc.r, h[:4]); err != nil {
		return rawReply{}, err
	}
	switch binary.BigEndian.Uint32(h[:]) {
	case simpleReplyMagic:
		if _, err := io.ReadFull(rc.r, h[4:16]); err != nil {
			return rawReply{}, err
		}
		rr := rawReply{errno: binary.BigEndian.Uint32(h[4:]), handle: binary.BigEndian.Uint64(h[8:])}
		if rr.errno == 0 && readLen > 0 {
			rr.data = make([]byte, readLen)
			if _, err := io.ReadFull(rc.r, rr.data); err != nil {
				return rr, err
			}
		}
		return rr, nil
	case structuredReplyMagic:
		var rr rawReply
		for {
			if _, err := io.ReadFull(rc.r, h[4:20]); err != nil {
				return rr, err
			}
			flags := binary.BigEndian.Uint16(h[4:])
			typ := binary.BigEndian.Uint16(h[6:])
			rr.handle = binary.BigEndian.Uint64(h[8:])
			p := make([]byte, binary.BigEndian.Uint32(h[16:]))
			if _, err := io.ReadFull(rc.r, p); err != nil {
				return rr, err
			}
			rr.chunks = append(rr.chunks, typ)
			switch typ {
			case replyTypeOffsetData:
				rr.data = append(rr.data, p[8:]...)
			case replyTypeBlockStatus:
				rr.data = p
			case replyTypeError, replyTypeErrorOffset:
				rr.errno = binary.BigEndian.Uint32(p)
			}
			if flags&replyFlagDone != 0 {
				return rr, nil
			}
			if _, err := io.ReadFull(rc.r, h[:4]); err != nil {
				return rr, err
			}
			if binary.BigEndian.Uint32(h[:]) != structuredReplyMagic {
				return rr, errors.New("mixed reply magics")
			}
		}
	}
	return rawReply{}, errors.New("bad reply magic")
}

// closed reports whether the server hung up (EOF or reset) within a while.
func (rc *rawConn) closed() bool {
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := rc.r.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// debugLogger logs at DEBUG and above to the buffer it returns.
func debugLogger() (*slog.Logger, *logtest.Buffer) {
	return logtest.Logger(&slog.HandlerOptions{Level: slog.LevelDebug})
}

// writeFlushRead sends n rounds of an 8 KiB WRITE (bytes seed+i), a FLUSH
// and a READ of it back, one request at a time (queue depth 1), checking
// every reply; h is the last handle used.
func (rc *rawConn) writeFlushRead(t testing.TB, h *uint64, seed byte, n int) {
	t.Helper()
	for i := range n {
		p := bytes.Repeat([]byte{seed + byte(i)}, 8192)
		off := uint64(i) * 8192
		*h++
		rc.request(Request{Type: CmdWrite, Handle: *h, Offset: off, Length: 8192}, p)
		if r, err := rc.reply(0); err != nil || r.errno != 0 || r.handle != *h {
			t.Fatalf("write %d: %v (errno %d)", i, err, r.errno)
		}
		*h++
		rc.request(Request{Type: CmdFlush, Handle: *h}, nil)
		if r, err := rc.reply(0); err != nil || r.errno != 0 {
			t.Fatalf("flush %d: %v (errno %d)", i, err, r.errno)
		}
		*h++
		rc.request(Request{Type: CmdRead, Handle: *h, Offset: off, Length: 8192}, nil)
		r, err := rc.reply(8192)
		if err != nil || r.errno != 0 || !bytes.Equal(r.data, p) {
			t.Fatalf("read %d: %v (errno %d), data right: %v", i, err, r.errno, bytes.Equal(r.data, p))
		}
	}
}

// startLargeRead enters transmission (structured replies) on export
// testName and asks for a read of size bytes at offset 0 with a 64 KiB
// receive buffer, which keeps most of the reply in the server's socket and
// its sendfile call until this side reads it; it reads the reply's header,
// leaving its data to the caller.
func (rc *rawConn) startLargeRead(size uint32) {
	rc.t.Helper()
	if err := rc.c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		rc.t.Fatal(err)
	}
	rc.goTransmission(testName, true, false)
	rc.request(Request{Type: CmdRead, Handle: 1, Offset: 0, Length: size}, nil)
	var hdr [structuredHeaderLen + 8]byte
	if _, err := io.ReadFull(rc.r, hdr[:]); err != nil {
		rc.t.Fatal(err)
	}
	if binary.BigEndian.Uint32(hdr[:]) != structuredReplyMagic || binary.BigEndian.Uint16(hdr[6:]) != replyTypeOffsetData {
		rc.t.Fatalf("unexpected reply header %x", hdr)
	}
}
