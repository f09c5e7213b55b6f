package donor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

const testCred = "lease-cred-0123456789abcdef"

// startDonor serves a donor with a region of size bytes under testCred
// until the test ends. (memorytest.Start does the same for other
// packages; it cannot be imported here.)
func startDonor(t testing.TB, size int64, credits int) (*Donor, string) {
	t.Helper()
	return startDonorWith(t, size, credits, nil)
}

// startDonorWith is startDonor with set (nil: none) setting the donor's
// fields before it serves.
func startDonorWith(t testing.TB, size int64, credits int, set func(*Donor)) (*Donor, string) {
	t.Helper()
	d := New(nil)
	d.Credits = credits
	if set != nil {
		set(d)
	}
	if err := d.AddRegion(testCred, size); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		_ = d.RemoveRegion(testCred)
	})
	return d, ln.Addr().String()
}

func seedFrames() [][]byte {
	var out [][]byte
	add := func(h protocol.Header, payload []byte) {
		b := make([]byte, protocol.HeaderSize, protocol.HeaderSize+len(payload))
		h.Payload = uint32(len(payload))
		h.Encode(b)
		out = append(out, append(b, payload...))
	}
	hello := (&protocol.Hello{Kind: protocol.KindControl, Credential: testCred}).Encode(nil)
	add(protocol.Header{Op: protocol.OpHello, Seq: 1}, hello)
	add(protocol.Header{Op: protocol.OpRead, Seq: 2, Offset: 100, Length: 64}, nil)
	add(protocol.Header{Op: protocol.OpWrite, Seq: 3, Offset: 4096, Length: 5}, []byte("hello"))
	add(protocol.Header{Op: protocol.OpPing, Seq: 4}, nil)
	add(protocol.Header{Op: protocol.OpCredit, Flags: protocol.FlagResponse, Offset: 1, Credits: 64}, nil)
	add(protocol.Header{Op: protocol.OpRead, Flags: protocol.FlagResponse, Status: protocol.StatusRange, Seq: 5}, []byte("memory: out of range"))
	add(protocol.Header{Op: protocol.OpRead, Flags: protocol.FlagResponse, Seq: 6, Length: 3}, []byte("abc"))
	// A move's source: a control HELLO carrying the generation of the
	// region it sends (protocol.MoveGeneration).
	add(protocol.Header{Op: protocol.OpHello, Seq: 1, Length: protocol.HelloReplyGenSize, Offset: 0x9e3779b97f4a7c15}, hello)
	return out
}

// FuzzDonorStream feeds arbitrary bytes to a donor connection after a valid
// HELLO (and, separately, as the first frame): the donor must neither panic
// nor write outside its region, and must end the connection.
func FuzzDonorStream(f *testing.F) {
	frames := seedFrames()
	f.Add(false, bytes.Join(frames[1:4], nil))
	f.Add(true, bytes.Join(frames, nil))
	f.Add(false, frames[5])
	f.Add(true, bytes.Join([][]byte{frames[len(frames)-1], frames[3]}, nil)) // a move's HELLO, a PING
	f.Fuzz(func(t *testing.T, raw bool, in []byte) {
		d := New(nil)
		if err := d.AddRegion(testCred, 8192); err != nil {
			t.Fatal(err)
		}
		defer d.RemoveRegion(testCred)
		gen, err := d.RegionGeneration(testCred)
		if err != nil {
			t.Fatal(err)
		}
		// Whatever a client sends, the generation of a region that does
		// not receive a move stays the one drawn at AddRegion.
		defer func() {
			if g, err := d.RegionGeneration(testCred); err != nil || g != gen {
				t.Errorf("the region's generation is %#x (%v), was %#x", g, err, gen)
			}
		}()
		srv, cli := net.Pipe()
		done := make(chan struct{})
		go func() { defer close(done); d.handle(srv) }()
		go func() { _, _ = io.Copy(io.Discard, cli) }()
		if !raw {
			// A control session, then a sync connection joining it would
			// need the session id; feed the stream on the control
			// connection instead, which must reject anything but PING.
			_, _ = cli.Write(frames[0])
		}
		_, _ = cli.Write(in)
		_ = cli.Close()
		<-done
	})
}

// FuzzSyncStream runs arbitrary bytes through a data connection's request
// loop against a small region.
func FuzzSyncStream(f *testing.F) {
	frames := seedFrames()
	f.Add(bytes.Join(frames[1:4], nil))
	f.Add(frames[2])
	f.Fuzz(func(t *testing.T, in []byte) {
		d := New(nil)
		d.Credits = 2
		if err := d.AddRegion(testCred, 8192); err != nil {
			t.Fatal(err)
		}
		defer d.RemoveRegion(testCred)
		ctrlS, ctrlC := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, ctrlC) }()
		s, _, _, st, _ := d.attach(ctrlS, protocol.Hello{Kind: protocol.KindControl, Credential: testCred}, protocol.Header{})
		if st != protocol.StatusOK {
			t.Fatal(st)
		}
		srv, cli := net.Pipe()
		s2, w, _, st, _ := d.attach(srv, protocol.Hello{Kind: protocol.KindQueue, Session: s.id, Credential: testCred}, protocol.Header{})
		if st != protocol.StatusOK {
			t.Fatal(st)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer s2.reg.users.Done()
			defer d.detach(s2, srv, w)
			d.serveData(s2, srv, protocol.KindQueue, w)
		}()
		go func() { _, _ = io.Copy(io.Discard, cli) }()
		_, _ = cli.Write(in)
		_ = cli.Close()
		<-done
		_ = ctrlC.Close()
		s.reg.users.Done()
		d.endSession(s)
	})
}

// FuzzSyncRaw sends arbitrary bytes after a valid HELLO on a real loopback
// bulk connection, which the donor serves with raw syscalls (serveSync):
// it must neither crash nor hang, and must keep serving other sessions.
func FuzzSyncRaw(f *testing.F) {
	frames := seedFrames()
	f.Add(bytes.Join(frames[1:4], nil))
	f.Add(frames[2][:34])
	f.Add(frames[5])
	d, addr := startDonor(f, 8192, 0)
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, in []byte) {
		// A region per input: RemoveRegion ends the session synchronously.
		cred := fmt.Sprintf("fuzz-%d", n.Add(1))
		if err := d.AddRegion(cred, 8192); err != nil {
			t.Fatal(err)
		}
		defer d.RemoveRegion(cred)
		ctrl, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer ctrl.Close()
		sess := helloRaw(t, ctrl, protocol.Hello{Kind: protocol.KindControl, Credential: cred})
		sc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		helloRaw(t, sc, protocol.Hello{Kind: protocol.KindBulk, Session: sess, Credential: cred})
		go func() {
			_, _ = sc.Write(in)
			_ = sc.(*net.TCPConn).CloseWrite()
		}()
		_ = sc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, sc); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("donor did not finish the connection")
			}
		}
	})
}

// helloRaw sends HELLO m on c and returns the reply's session id.
func helloRaw(t *testing.T, c net.Conn, m protocol.Hello) uint64 {
	t.Helper()
	return binary.BigEndian.Uint64(helloFrame(t, c, m, protocol.Header{}))
}

// helloFrame sends HELLO m on c in header h (its op and payload length
// set here; the rest, a reply length or a move's generation, as given)
// and returns the reply's payload. A reply other than OK fails the test.
func helloFrame(t *testing.T, c net.Conn, m protocol.Hello, h protocol.Header) []byte {
	t.Helper()
	b := m.Encode(make([]byte, protocol.HeaderSize))
	h.Op = protocol.OpHello
	h.Payload = uint32(len(b) - protocol.HeaderSize)
	h.Encode(b)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	var hdr [protocol.HeaderSize]byte
	fr, err := protocol.ReadFrame(c, hdr[:], nil)
	if err != nil || fr.Status != protocol.StatusOK {
		t.Fatalf("hello: %v %d %s", err, fr.Status, fr.Data)
	}
	return fr.Data
}
