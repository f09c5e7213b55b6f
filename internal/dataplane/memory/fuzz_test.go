package memory

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

func seedFrames() [][]byte {
	var out [][]byte
	add := func(h Header, payload []byte) {
		b := make([]byte, HeaderSize, HeaderSize+len(payload))
		h.Payload = uint32(len(payload))
		h.Encode(b)
		out = append(out, append(b, payload...))
	}
	hello := (&Hello{Kind: KindControl, Credential: testCred}).Encode(nil)
	add(Header{Op: OpHello, Seq: 1}, hello)
	add(Header{Op: OpRead, Seq: 2, Offset: 100, Length: 64}, nil)
	add(Header{Op: OpWrite, Seq: 3, Offset: 4096, Length: 5}, []byte("hello"))
	add(Header{Op: OpPing, Seq: 4}, nil)
	add(Header{Op: OpCredit, Flags: FlagResponse, Offset: 1, Credits: 64}, nil)
	add(Header{Op: OpRead, Flags: FlagResponse, Status: StatusRange, Seq: 5}, []byte("memory: out of range"))
	add(Header{Op: OpRead, Flags: FlagResponse, Seq: 6, Length: 3}, []byte("abc"))
	return out
}

func FuzzDecodeHeader(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s[:HeaderSize])
	}
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		// A decoded header re-encodes to the same bytes.
		var out [HeaderSize]byte
		h.Encode(out[:])
		if !bytes.Equal(out[:], b[:HeaderSize]) {
			t.Fatalf("re-encoding differs: %x vs %x", out, b[:HeaderSize])
		}
		if h.Payload > MaxPayload {
			t.Fatal("payload bound not enforced")
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	f.Add((&Hello{Kind: KindControl, Credential: "c"}).Encode(nil))
	f.Add((&Hello{Kind: KindQueue, Session: 9, Credential: testCred}).Encode(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.Encode(nil), b) {
			t.Fatal("hello does not round-trip")
		}
	})
}

// FuzzDonorStream feeds arbitrary bytes to a donor connection after a valid
// HELLO (and, separately, as the first frame): the donor must neither panic
// nor write outside its region, and must end the connection.
func FuzzDonorStream(f *testing.F) {
	frames := seedFrames()
	f.Add(false, bytes.Join(frames[1:4], nil))
	f.Add(true, bytes.Join(frames, nil))
	f.Add(false, frames[5])
	f.Fuzz(func(t *testing.T, raw bool, in []byte) {
		d := NewDonor(nil)
		if err := d.AddRegion(testCred, 8192); err != nil {
			t.Fatal(err)
		}
		defer d.RemoveRegion(testCred)
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
		d := NewDonor(nil)
		d.Credits = 2
		if err := d.AddRegion(testCred, 8192); err != nil {
			t.Fatal(err)
		}
		defer d.RemoveRegion(testCred)
		ctrlS, ctrlC := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, ctrlC) }()
		s, _, st, _ := d.attach(ctrlS, Hello{Kind: KindControl, Credential: testCred})
		if st != StatusOK {
			t.Fatal(st)
		}
		srv, cli := net.Pipe()
		s2, qid, st, _ := d.attach(srv, Hello{Kind: KindQueue, Session: s.id, Credential: testCred})
		if st != StatusOK {
			t.Fatal(st)
		}
		done := make(chan struct{})
		go func() { defer close(done); defer s2.reg.users.Done(); d.serveData(s2, srv, KindQueue, qid) }()
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
	td := startDonor(f, 8192, 0)
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, in []byte) {
		// A region per input: RemoveRegion ends the session synchronously.
		cred := fmt.Sprintf("fuzz-%d", n.Add(1))
		if err := td.d.AddRegion(cred, 8192); err != nil {
			t.Fatal(err)
		}
		defer td.d.RemoveRegion(cred)
		ctrl, err := net.Dial("tcp", td.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer ctrl.Close()
		sess := helloRaw(t, ctrl, Hello{Kind: KindControl, Credential: cred})
		sc, err := net.Dial("tcp", td.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		helloRaw(t, sc, Hello{Kind: KindBulk, Session: sess, Credential: cred})
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

func helloRaw(t *testing.T, c net.Conn, m Hello) uint64 {
	b := m.Encode(make([]byte, HeaderSize))
	h := Header{Op: OpHello, Payload: uint32(len(b) - HeaderSize)}
	h.Encode(b)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	var hdr [HeaderSize]byte
	fr, err := ReadFrame(c, hdr[:], nil)
	if err != nil || fr.Status != StatusOK {
		t.Fatalf("hello: %v %d %s", err, fr.Status, fr.Data)
	}
	return binary.BigEndian.Uint64(fr.Data)
}

// FuzzQueueReplies feeds arbitrary donor bytes to a queue pair's reply
// reader with a 64-byte read (seq 1) and a 64-byte write (seq 2) pending.
// The write's source is never written to, and an operation succeeds only
// when the first reply for its sequence number is the right one: an OK
// response of its opcode carrying, for the read, exactly the bytes asked
// for, which land in its buffer.
func FuzzQueueReplies(f *testing.F) {
	reply := func(h Header, payload []byte) []byte {
		h.Flags, h.Payload = FlagResponse, uint32(len(payload))
		b := make([]byte, HeaderSize, HeaderSize+len(payload))
		h.Encode(b)
		return append(b, payload...)
	}
	data := bytes.Repeat([]byte{0x5a}, 64)
	f.Add(append(reply(Header{Op: OpWrite, Seq: 2, Length: 64}, nil), reply(Header{Op: OpRead, Seq: 1, Length: 64}, data)...))
	f.Add(reply(Header{Op: OpRead, Seq: 1, Status: StatusRange}, []byte("memory: out of range")))
	f.Add(append(reply(Header{Op: OpRead, Seq: 9, Length: 3}, []byte("abc")), reply(Header{Op: OpWrite, Seq: 2, Length: 64}, nil)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		srv, cli := net.Pipe()
		go func() {
			_, _ = srv.Write(in)
			_ = srv.Close()
		}()
		src := bytes.Repeat([]byte{0xc3}, 64)
		rd := &qop{op: Op{Buf: make([]byte, 64)}, seq: 1, done: make(chan error, 1)}
		wr := &qop{op: Op{Write: true, Buf: append([]byte(nil), src...)}, seq: 2, done: make(chan error, 1)}
		q := &QueuePair{c: &Client{opts: Options{Timeout: 10 * time.Second}}, conn: cli, br: bufio.NewReader(cli),
			wake: make(chan struct{}), pending: map[uint32]*qop{1: rd, 2: wr}, done: make(chan struct{})}
		q.reader()
		rerr, werr := <-rd.done, <-wr.done

		if !bytes.Equal(wr.op.Buf, src) {
			t.Fatal("a reply was written into the source of a write")
		}
		// The first complete reply for each sequence number, as long as
		// the frames before it are well formed.
		first := map[uint32][]byte{}
		for off := 0; off+HeaderSize <= len(in); {
			h, err := DecodeHeader(in[off : off+HeaderSize])
			end := off + HeaderSize + int(h.Payload)
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
			h, _ := DecodeHeader(fr)
			return h.Op == op && h.Status == StatusOK && int(h.Payload) == payload
		}
		if rerr == nil && (!ok(1, OpRead, 64) || !bytes.Equal(rd.op.Buf, first[1][HeaderSize:])) {
			t.Fatalf("read succeeded without its reply: %x", first[1])
		}
		if werr == nil && !ok(2, OpWrite, 0) {
			t.Fatalf("write succeeded without its reply: %x", first[2])
		}
	})
}
