package nic

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// streamConn is a connection whose peer sent the fixed bytes r holds and
// then closed; what is written to it is discarded.
type streamConn struct{ r io.Reader }

func (c *streamConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *streamConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *streamConn) Close() error                     { return nil }
func (c *streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

// frame encodes one tunnel frame.
func frame(typ uint8, seq uint32, p []byte) []byte {
	b := make([]byte, HeaderSize, HeaderSize+len(p))
	Header{Type: typ, Length: uint16(len(p)), Seq: seq}.Encode(b)
	return append(b, p...)
}

// ipPacket is an IPv4 packet of n bytes (n >= 20) from src, tagged.
func ipPacket(n int, src [4]byte, tag byte) []byte {
	p := make([]byte, n)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(n))
	p[9] = 17
	copy(p[12:], src[:])
	copy(p[16:], []byte{100, 64, 0, 1})
	for i := 20; i < n; i++ {
		p[i] = tag
	}
	return p
}

// FuzzTunnelStream feeds what the peer of a tunnel session sends on each
// of its connections (queue pairs) to the frame reader and the session's
// reordering: frames of every type, sequence numbers out of order,
// repeated, or beyond the reorder bound, data past the credit granted.
// It must never panic; every connection ends with an error wrapping one
// of the package's sentinels; packets are delivered gap-free in sequence
// order, each exactly as the frame that carried its number brought it;
// no more packets are held than MaxReorder; and no connection takes more
// data than it granted.
func FuzzTunnelStream(f *testing.F) {
	src := [4]byte{100, 64, 0, 2}
	credit := binary.BigEndian.AppendUint64(nil, 1<<20)
	f.Add(byte(0), uint16(64), bytes.Join([][]byte{frame(FrameData, 0, ipPacket(40, src, 'a')), frame(FramePing, 0, credit),
		frame(FrameCredit, 0, credit), frame(FrameData, 1, ipPacket(20, src, 0)), frame(FramePong, 0, credit)}, nil), []byte(nil))
	f.Add(byte(1), uint16(64), bytes.Join([][]byte{frame(FrameData, 1, ipPacket(60, src, 'b')), frame(FrameData, 3, ipPacket(21, src, 'd'))}, nil),
		bytes.Join([][]byte{frame(FrameData, 0, ipPacket(100, src, 'a')), frame(FrameData, 2, ipPacket(33, src, 'c'))}, nil))
	f.Add(byte(0), uint16(1), bytes.Join([][]byte{frame(FrameData, 0, ipPacket(1500, src, 'x')), frame(FrameData, 1, ipPacket(1500, src, 'y'))}, nil), []byte(nil))
	f.Add(byte(1), uint16(64), frame(FrameData, 0, ipPacket(20, src, 0)), frame(FrameData, 0, ipPacket(20, src, 0)))
	f.Add(byte(0), uint16(64), bytes.Join([][]byte{frame(FrameData, 5, ipPacket(20, src, 0)), frame(FrameData, 5, ipPacket(20, src, 0))}, nil), []byte(nil))
	f.Add(byte(0), uint16(64), frame(FrameError, 0, append([]byte{StatusGone}, "lease over"...)), []byte(nil))
	f.Add(byte(0), uint16(64), append(frame(FrameData, 0, ipPacket(28, src, 1)), 1, 0, 0xff, 0xff, 0, 0, 0, 1, 2, 3), []byte(nil))
	f.Add(byte(1), uint16(64), []byte{2, 0, 0, 7, 0, 0, 0, 0}, []byte{9, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, mode byte, window uint16, a, b []byte) {
		conns := 1 + int(mode&1)
		// The receive window in KiB, at least a 1500-byte packet's.
		win := max(uint32(window)<<10, 1500)
		var delivered [][]byte
		s := newSession(1, conns, conns > 1, &counters{}, func(pkt []byte) error {
			if len(pkt) < 20 || len(pkt) > MaxPacket {
				t.Fatalf("delivered a %d-byte packet", len(pkt))
			}
			_, _, _ = ipv4(pkt)
			_ = flowHash(pkt)
			delivered = append(delivered, append([]byte(nil), pkt...))
			return nil
		})
		accepted := map[uint32][]byte{}
		streams := [][]byte{a, b}
		for i := 0; i < conns; i++ {
			q := newQP(&streamConn{bytes.NewReader(streams[i])}, 1<<20, win, time.Hour)
			if !s.join(i, q) {
				t.Fatalf("connection %d could not join", i)
			}
			q.readLoop(func(seq uint32, pkt []byte) error {
				if q.recvd > q.limit.Load() {
					t.Fatalf("%d bytes taken, %d granted", q.recvd, q.limit.Load())
				}
				held := append([]byte(nil), pkt...)
				if err := s.recv(q, seq, pkt); err != nil {
					return err
				}
				accepted[seq] = held
				return nil
			})
			err := q.Err()
			if err == nil {
				t.Fatalf("connection %d: the reader returned without an error", i)
			}
			known := false
			for _, e := range []error{ErrLost, ErrBadFrame, ErrCredit, ErrAuth, ErrGone, ErrVersion, ErrBusy, ErrAddr, ErrTLSRequired} {
				known = known || errors.Is(err, e)
			}
			if !known {
				t.Fatalf("connection %d ended with %v, which wraps no sentinel", i, err)
			}
			if len(s.held) > MaxReorder {
				t.Fatalf("%d packets held", len(s.held))
			}
		}
		if uint32(len(delivered)) != s.next {
			t.Fatalf("%d packets delivered, the next expected is %d", len(delivered), s.next)
		}
		for i, p := range delivered {
			if want, ok := accepted[uint32(i)]; !ok || !bytes.Equal(p, want) {
				t.Fatalf("packet %d delivered as %x, sent as %x", i, p, want)
			}
		}
		for seq := range s.held {
			if _, ok := accepted[seq]; !ok || int32(seq-s.next) <= 0 {
				t.Fatalf("packet %d held, next %d", seq, s.next)
			}
		}
	})
}
