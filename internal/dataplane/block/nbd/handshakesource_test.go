package nbd

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// rawDialFrom is rawDial from the local address src (another loopback
// address, 127.0.0.2, for a second source).
func rawDialFrom(t testing.TB, src, addr string, cflags uint32) *rawConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	rc := &rawConn{t: t, c: c, r: bufio.NewReader(c)}
	var g [18]byte
	if _, err := io.ReadFull(rc.r, g[:]); err != nil {
		t.Fatalf("greeting from %s: %v", src, err)
	}
	if binary.BigEndian.Uint64(g[:]) != nbdMagic || binary.BigEndian.Uint64(g[8:]) != optMagic {
		t.Fatalf("bad greeting %x", g)
	}
	var f [4]byte
	binary.BigEndian.PutUint32(f[:], cflags)
	rc.write(f[:])
	return rc
}

// TestHandshakesPerSource: a client on a slow link (127.0.0.2) is in its
// option phase while another source (127.0.0.1) opens many times
// Server.MaxHandshakes connections and stalls each in its option phase.
// The flood's connections push out only the flood's own, whether the
// source hits its own bound (MaxHandshakesPerSource) or the server's
// (the source holding the most is the one evicted from), and the slow
// client then completes its handshake and its I/O.
func TestHandshakesPerSource(t *testing.T) {
	const limit = 8
	for _, c := range []struct {
		name      string
		perSource int
		held      int // the flood's connections left open
	}{
		{"per-source bound", 4, 4},
		{"server bound", -1, limit - 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Server{MaxHandshakes: limit, MaxHandshakesPerSource: c.perSource}
			if err := s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 20)}); err != nil {
				t.Fatal(err)
			}
			addr := serveOn(t, s)
			slow := rawDialFrom(t, "127.0.0.2", addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
			const flood = 3 * limit
			var rcs []*rawConn
			for i := 0; i < flood; i++ {
				// Back from rawDial: the server greeted it, so
				// it holds an option phase.
				rcs = append(rcs, rawDialFrom(t, "127.0.0.1", addr, clientFlagFixedNewstyle|clientFlagNoZeroes))
				if st := s.Handshakes(); st.Active > limit {
					t.Fatalf("after %d stalled connections: %+v, want at most %d", i+1, st, limit)
				}
			}
			// The slow client goes on where it stopped.
			slow.goTransmission(testName, false, false)
			var h uint64
			slow.writeFlushRead(t, &h, 0x40, 2)
			if st := s.Handshakes(); st.Active != c.held || st.Sources != 1 || st.Evicted != int64(flood-c.held) {
				t.Fatalf("handshakes %+v: want %d open (the flood's) from 1 source, %d closed to make room", st, c.held, flood-c.held)
			}
			// The flood's oldest were closed, its newest kept.
			for i, rc := range rcs[:flood-c.held] {
				if !rc.closed() {
					t.Fatalf("stalled connection %d still open", i)
				}
			}
		})
	}
}
