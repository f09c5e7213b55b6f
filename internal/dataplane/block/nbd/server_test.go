package nbd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

const testName = "lease-7f3a9c-secret-token"

func TestHandshakeOptions(t *testing.T) {
	_, addr := startServer(t, Export{Name: testName, Description: "test disk", Backend: NewMemBackend(1 << 20)})
	cases := []struct {
		name string
		opt  uint32
		data []byte
		pre  []uint32 // options sent first (expected to succeed)
		want []uint32
	}{
		{"list is refused by policy", optList, nil, nil, []uint32{repErrPolicy}},
		{"list with data is invalid", optList, []byte{1}, nil, []uint32{repErrInvalid}},
		{"info unknown export", optInfo, infoData("nope"), nil, []uint32{repErrUnknown}},
		{"info prefix of a real name is unknown", optInfo, infoData(testName[:5]), nil, []uint32{repErrUnknown}},
		{"info known export", optInfo, infoData(testName, infoBlockSize), nil, []uint32{repInfo, repInfo, repAck}},
		{"info with description", optInfo, infoData(testName, infoDescription), nil, []uint32{repInfo, repInfo, repInfo, repAck}},
		{"info short data", optInfo, []byte{0, 0}, nil, []uint32{repErrInvalid}},
		{"info name length beyond data", optInfo, []byte{0, 0, 1, 0, 0, 0}, nil, []uint32{repErrInvalid}},
		{"info count beyond data", optInfo, append(infoData(testName), 0), nil, []uint32{repErrInvalid}},
		{"go unknown export", optGo, infoData("nope"), nil, []uint32{repErrUnknown}},
		{"structured reply with data", optStructuredReply, []byte{1}, nil, []uint32{repErrInvalid}},
		{"set meta without structured", optSetMetaContext, metaData(testName, MetaContextBaseAllocation), nil, []uint32{repErrInvalid}},
		{"set meta unknown export", optSetMetaContext, metaData("nope", MetaContextBaseAllocation), []uint32{optStructuredReply}, []uint32{repErrUnknown}},
		{"set meta malformed", optSetMetaContext, metaData(testName, "base:allocation")[:20], []uint32{optStructuredReply}, []uint32{repErrInvalid}},
		{"set meta trailing bytes", optSetMetaContext, append(metaData(testName, "base:allocation"), 9), []uint32{optStructuredReply}, []uint32{repErrInvalid}},
		{"set meta base:allocation", optSetMetaContext, metaData(testName, MetaContextBaseAllocation), []uint32{optStructuredReply}, []uint32{repMetaContext, repAck}},
		{"set meta unknown namespace", optSetMetaContext, metaData(testName, "qemu:dirty-bitmap:x"), []uint32{optStructuredReply}, []uint32{repAck}},
		{"list meta all", optListMetaContext, metaData(testName), []uint32{optStructuredReply}, []uint32{repMetaContext, repAck}},
		{"list meta base:", optListMetaContext, metaData(testName, "base:"), []uint32{optStructuredReply}, []uint32{repMetaContext, repAck}},
		{"starttls without TLS configured", optStartTLS, nil, nil, []uint32{repErrPolicy}},
		{"unknown option", 999, []byte("x"), nil, []uint32{repErrUnsup}},
		{"abort", optAbort, nil, nil, []uint32{repAck}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
			for _, p := range tc.pre {
				rc.optExpect(p, nil)
			}
			got := rc.optExpect(tc.opt, tc.data)
			if !equalU32(got, tc.want) {
				t.Fatalf("replies %x, want %x", got, tc.want)
			}
		})
	}
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestHandshakeHangups(t *testing.T) {
	_, addr := startServer(t, Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	cases := []struct {
		name   string
		cflags uint32
		send   func(rc *rawConn)
	}{
		{"unknown client flags", 1 << 7, func(*rawConn) {}},
		{"bad option magic", 3, func(rc *rawConn) { rc.write(make([]byte, 16)) }},
		{"export name unknown", 3, func(rc *rawConn) { rc.opt(optExportName, []byte("nope")) }},
		{"non-fixed newstyle with go", 0, func(rc *rawConn) { rc.opt(optGo, infoData(testName)) }},
		{"oversized option", 3, func(rc *rawConn) {
			b := binary.BigEndian.AppendUint64(nil, optMagic)
			b = binary.BigEndian.AppendUint32(b, optInfo)
			b = binary.BigEndian.AppendUint32(b, 1<<30)
			rc.write(b)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := rawDial(t, addr, tc.cflags)
			tc.send(rc)
			if !rc.closed() {
				t.Fatal("server did not hang up")
			}
		})
	}
}

func TestExportNameOption(t *testing.T) {
	_, addr := startServer(t, Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	for _, noZeroes := range []bool{false, true} {
		cf := clientFlagFixedNewstyle
		if noZeroes {
			cf |= clientFlagNoZeroes
		}
		rc := rawDial(t, addr, cf)
		rc.opt(optExportName, []byte(testName))
		n := 10
		if !noZeroes {
			n += 124
		}
		b := make([]byte, n)
		if _, err := rc.r.Read(b[:1]); err != nil {
			t.Fatal(err)
		}
		if _, err := ioReadFull(rc, b[1:]); err != nil {
			t.Fatal(err)
		}
		if got := binary.BigEndian.Uint64(b); got != 1<<20 {
			t.Fatalf("size %d", got)
		}
		rc.request(Request{Type: CmdRead, Handle: 5, Offset: 0, Length: 512}, nil)
		rr, err := rc.reply(512)
		if err != nil || rr.errno != 0 || rr.handle != 5 || len(rr.data) != 512 {
			t.Fatalf("read after EXPORT_NAME: %+v %v", rr, err)
		}
	}
}

func ioReadFull(rc *rawConn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := rc.r.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func TestTransmissionErrors(t *testing.T) {
	const size = 1 << 20
	_, addr := startServer(t,
		Export{Name: "rw", Backend: NewMemBackend(size), MinBlock: 512, MaxBlock: 64 << 10},
		Export{Name: "ro", Backend: NewMemBackend(size), ReadOnly: true},
		Export{Name: "notrim", Backend: struct{ Backend }{NewMemBackend(size)}},
	)
	cases := []struct {
		export     string
		name       string
		req        Request
		payload    int
		structured bool
		meta       bool
		want       uint32
	}{
		{"rw", "read ok", Request{Type: CmdRead, Length: 4096}, 0, false, false, 0},
		{"rw", "read beyond end", Request{Type: CmdRead, Offset: size - 512, Length: 1024}, 0, false, false, EINVAL},
		{"rw", "read offset overflow", Request{Type: CmdRead, Offset: ^uint64(0) - 511, Length: 1024}, 0, false, false, EINVAL},
		{"rw", "read misaligned offset", Request{Type: CmdRead, Offset: 100, Length: 512}, 0, false, false, EINVAL},
		{"rw", "read misaligned length", Request{Type: CmdRead, Length: 100}, 0, false, false, EINVAL},
		{"rw", "read oversized", Request{Type: CmdRead, Length: 128 << 10}, 0, false, false, EINVAL},
		{"rw", "read oversized structured", Request{Type: CmdRead, Length: 128 << 10}, 0, true, false, EINVAL},
		{"rw", "read DF without structured", Request{Type: CmdRead, Flags: CmdFlagDF, Length: 512}, 0, false, false, EINVAL},
		{"rw", "read DF structured", Request{Type: CmdRead, Flags: CmdFlagDF, Length: 512}, 0, true, false, 0},
		{"rw", "read unknown flag", Request{Type: CmdRead, Flags: 1 << 9, Length: 512}, 0, false, false, EINVAL},
		{"rw", "write ok fua", Request{Type: CmdWrite, Flags: CmdFlagFUA, Length: 512}, 512, false, false, 0},
		{"rw", "write beyond end", Request{Type: CmdWrite, Offset: size, Length: 512}, 512, false, false, ENOSPC},
		{"rw", "write misaligned", Request{Type: CmdWrite, Offset: 1, Length: 512}, 512, false, false, EINVAL},
		{"rw", "write oversized", Request{Type: CmdWrite, Length: 128 << 10}, 128 << 10, false, false, EINVAL},
		{"rw", "write zero length", Request{Type: CmdWrite}, 0, false, false, 0},
		{"ro", "write read-only", Request{Type: CmdWrite, Length: 512}, 512, false, false, EPERM},
		{"ro", "trim read-only", Request{Type: CmdTrim, Length: 512}, 0, false, false, EPERM},
		{"ro", "zeroes read-only", Request{Type: CmdWriteZeroes, Length: 512}, 0, false, false, EPERM},
		{"ro", "flush read-only ok", Request{Type: CmdFlush}, 0, false, false, 0},
		{"ro", "read read-only ok", Request{Type: CmdRead, Length: 512}, 0, true, false, 0},
		{"rw", "trim ok", Request{Type: CmdTrim, Length: 4096}, 0, false, false, 0},
		{"rw", "trim beyond end", Request{Type: CmdTrim, Offset: size - 512, Length: 1024}, 0, false, false, EINVAL},
		{"notrim", "trim unsupported", Request{Type: CmdTrim, Length: 512}, 0, false, false, EINVAL},
		{"rw", "zeroes ok no-hole", Request{Type: CmdWriteZeroes, Flags: CmdFlagNoHole, Length: 1 << 20}, 0, false, false, 0},
		{"notrim", "zeroes emulated", Request{Type: CmdWriteZeroes, Length: 3 << 18}, 0, false, false, 0},
		{"rw", "zeroes beyond end", Request{Type: CmdWriteZeroes, Offset: size, Length: 512}, 0, false, false, ENOSPC},
		{"rw", "block status without meta", Request{Type: CmdBlockStatus, Length: 512}, 0, true, false, EINVAL},
		{"rw", "block status ok", Request{Type: CmdBlockStatus, Length: 512}, 0, true, true, 0},
		{"rw", "block status zero length", Request{Type: CmdBlockStatus}, 0, true, true, EINVAL},
		{"rw", "block status beyond end", Request{Type: CmdBlockStatus, Offset: size, Length: 512}, 0, true, true, EINVAL},
		{"rw", "cache not advertised", Request{Type: CmdCache, Length: 512}, 0, false, false, EINVAL},
		{"rw", "unknown command", Request{Type: 77, Length: 512}, 0, false, false, EINVAL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := rawDial(t, addr, 3)
			rc.goTransmission(tc.export, tc.structured, tc.meta)
			tc.req.Handle = 0xabcdef
			rc.request(tc.req, make([]byte, tc.payload))
			rl := 0
			if tc.req.Type == CmdRead {
				rl = int(tc.req.Length)
			}
			rr, err := rc.reply(rl)
			if err != nil {
				t.Fatal(err)
			}
			if rr.handle != 0xabcdef || rr.errno != tc.want {
				t.Fatalf("handle %#x errno %d, want errno %d", rr.handle, rr.errno, tc.want)
			}
			if tc.structured && tc.req.Type == CmdRead && tc.want != 0 && rr.chunks[0] != replyTypeError {
				t.Fatalf("structured read error sent as chunk %d", rr.chunks[0])
			}
			// The connection stays usable after an error.
			rc.request(Request{Type: CmdRead, Handle: 2, Length: 512}, nil)
			if rr, err := rc.reply(512); err != nil || rr.errno != 0 || rr.handle != 2 || len(rr.data) != 512 {
				t.Fatalf("follow-up read: %+v %v", rr, err)
			}
			// DISC ends it cleanly.
			rc.request(Request{Type: CmdDisc}, nil)
			if !rc.closed() {
				t.Fatal("server kept the connection after DISC")
			}
		})
	}
}

func TestTransmissionHangups(t *testing.T) {
	_, addr := startServer(t, Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	rc := rawDial(t, addr, 3)
	rc.goTransmission(testName, true, false)
	rc.write(make([]byte, requestHeaderLen)) // bad request magic
	if !rc.closed() {
		t.Fatal("server accepted a bad request magic")
	}
	// A client that vanishes mid-payload costs nothing else.
	other := dial(t, addr, testName)
	rc2 := rawDial(t, addr, 3)
	rc2.goTransmission(testName, false, false)
	b := make([]byte, requestHeaderLen)
	putRequest(b, Request{Type: CmdWrite, Length: 1 << 20})
	rc2.write(append(b, make([]byte, 1000)...))
	rc2.c.Close()
	buf := make([]byte, 4096)
	if _, err := other.ReadAt(buf, 0); err != nil {
		t.Fatalf("other client broken: %v", err)
	}
}

func TestBlockStatus(t *testing.T) {
	be := &extBackend{MemBackend: NewMemBackend(1 << 20), exts: []Extent{{4096, 0}, {8192, StateHole | StateZero}, {4096, StateHole | StateZero}, {1 << 20, 0}}}
	_, addr := startServer(t, Export{Name: testName, Backend: be})
	rc := rawDial(t, addr, 3)
	rc.goTransmission(testName, true, true)
	for _, tc := range []struct {
		flags uint16
		want  []uint32
	}{
		{0, []uint32{4096, 0, 12288, 3, 16384, 0}},
		{CmdFlagReqOne, []uint32{4096, 0}},
	} {
		rc.request(Request{Type: CmdBlockStatus, Flags: tc.flags, Handle: 9, Length: 32768}, nil)
		rr, err := rc.reply(0)
		if err != nil || rr.errno != 0 {
			t.Fatal(rr, err)
		}
		if binary.BigEndian.Uint32(rr.data) != metaContextID {
			t.Fatal("wrong context id")
		}
		var got []uint32
		for i := 4; i+4 <= len(rr.data); i += 4 {
			got = append(got, binary.BigEndian.Uint32(rr.data[i:]))
		}
		if !equalU32(got, tc.want) {
			t.Fatalf("flags %d: extents %v, want %v", tc.flags, got, tc.want)
		}
	}
}

type extBackend struct {
	*MemBackend
	exts []Extent
}

func (e *extBackend) Extents(off, n int64) ([]Extent, error) { return e.exts, nil }

func TestClientRoundTrip(t *testing.T) {
	be := NewMemBackend(8 << 20)
	_, addr := startServer(t, Export{Name: testName, Backend: be, MaxBlock: 1 << 20})
	for _, structured := range []bool{true, false} {
		var opts []DialOption
		if !structured {
			opts = append(opts, WithoutStructuredReplies())
		}
		c := dial(t, addr, testName, opts...)
		if c.Size() != 8<<20 {
			t.Fatalf("size %d", c.Size())
		}
		if f := c.Flags(); f&FlagCanMultiConn == 0 || f&FlagSendTrim == 0 || f&FlagReadOnly != 0 {
			t.Fatalf("flags %#x", f)
		}
		data := make([]byte, 8<<20)
		rand.Read(data)
		// Concurrent pipelined writes of 64 KiB pieces, then one big read
		// that the client splits into 1 MiB requests.
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for off := i * 65536; off < len(data); off += 16 * 65536 {
					if _, err := c.WriteAt(data[off:off+65536], int64(off)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(data))
		if n, err := c.ReadAt(got, 0); err != nil || n != len(got) || !bytes.Equal(got, data) {
			t.Fatalf("read back: n=%d err=%v equal=%v", n, err, bytes.Equal(got, data))
		}
		if _, err := c.WriteAtContext(context.Background(), data[:4096], 4096, true); err != nil {
			t.Fatal(err)
		}
		if err := c.Trim(0, 4096); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteZeroes(8192, 8192, true); err != nil {
			t.Fatal(err)
		}
		c.ReadAt(got[:16384], 0)
		want := append(make([]byte, 4096), data[:4096]...)
		want = append(want, make([]byte, 8192)...)
		if !bytes.Equal(got[:16384], want) {
			t.Fatal("trim/zeroes not visible")
		}
		// io.ReaderAt semantics at the end.
		if n, err := c.ReadAt(got[:8192], 8<<20-4096); n != 4096 || err == nil {
			t.Fatalf("short read at end: n=%d err=%v", n, err)
		}
		var ne *Error
		if _, err := c.WriteAt(got[:1], 8<<20); err == nil {
			t.Fatal("write beyond end succeeded")
		}
		if err := c.do(context.Background(), CmdRead, 0, 8<<20, 512, nil, got[:512]); !errors.As(err, &ne) || ne.Errno != EINVAL {
			t.Fatalf("read beyond end: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ReadAt(got[:512], 0); !errors.Is(err, ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
	}
}

func TestClientErrors(t *testing.T) {
	_, addr := startServer(t, Export{Name: testName, Backend: NewMemBackend(1 << 20), ReadOnly: true})
	ctx := context.Background()
	if _, err := Dial(ctx, "tcp", addr, "wrong"); !errors.Is(err, ErrExportNotFound) {
		t.Fatalf("unknown export: %v", err)
	}
	c := dial(t, addr, testName)
	var ne *Error
	if _, err := c.WriteAt(make([]byte, 512), 0); !errors.As(err, &ne) || ne.Errno != EPERM {
		t.Fatalf("write to read-only: %v", err)
	}
	if err := c.Trim(0, 512); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("trim on read-only: %v", err)
	}
}

// stallServer completes the handshake and then never replies: it reads
// one request and closes (closeAfter), or waits until the client goes away.
func stallServer(t *testing.T, closeAfter bool) string {
	return handshakeServer(t, func(r *bufio.Reader) {
		var b [requestHeaderLen]byte
		ioReadFullR(r, b[:])
		if closeAfter {
			return
		}
		ioReadFullR(r, b[:]) // blocks until the client goes away
	})
}

// handshakeServer accepts one client, completes its handshake for a 1 MiB
// memory export named testName, then hands the connection's reader to
// then; the connection closes when then returns.
func handshakeServer(t *testing.T, then func(r *bufio.Reader)) string {
	s := &Server{}
	s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	ln := listen(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		r := newConnReader(nc)
		if _, err := s.negotiate(nc, r); err != nil {
			return
		}
		then(r)
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func TestClientServerVanishes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close bool
		want  error
	}{
		{"server closes", true, ErrClosed},
		{"server stalls", false, ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := stallServer(t, tc.close)
			c := dial(t, addr, testName, WithRequestTimeout(300*time.Millisecond))
			start := time.Now()
			_, err := c.ReadAt(make([]byte, 4096), 0)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v", d)
			}
			if _, err := c.ReadAt(make([]byte, 512), 0); err == nil {
				t.Fatal("dead client still works")
			}
		})
	}
}

func TestClientContextCancel(t *testing.T) {
	addr := stallServer(t, false)
	c := dial(t, addr, testName)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.ReadAtContext(ctx, make([]byte, 4096), 0)
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

func TestRemoveExportClosesConnections(t *testing.T) {
	s, addr := startServer(t, Export{Name: testName, Backend: NewMemBackend(1 << 20)}, Export{Name: "other", Backend: NewMemBackend(1 << 20)})
	c := dial(t, addr, testName)
	o := dial(t, addr, "other")
	if err := s.RemoveExport(testName); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveExport(testName); !errors.Is(err, ErrExportNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.ReadAt(make([]byte, 512), 0); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("connection survived RemoveExport")
		}
	}
	if _, err := o.ReadAt(make([]byte, 512), 0); err != nil {
		t.Fatalf("other export affected: %v", err)
	}
	if _, err := Dial(context.Background(), "tcp", addr, testName); !errors.Is(err, ErrExportNotFound) {
		t.Fatalf("dial removed export: %v", err)
	}
}

func TestAddExportValidation(t *testing.T) {
	var s Server
	be := NewMemBackend(1 << 20)
	cases := []struct {
		name string
		e    Export
		want error
	}{
		{"nil backend", Export{Name: "a"}, ErrInvalidExport},
		{"min not power of two", Export{Name: "a", Backend: be, MinBlock: 3}, ErrInvalidExport},
		{"max too big", Export{Name: "a", Backend: be, MaxBlock: 64 << 20}, ErrInvalidExport},
		{"size not multiple of min", Export{Name: "a", Backend: NewMemBackend(1000), MinBlock: 512}, ErrInvalidExport},
		{"long name", Export{Name: strings.Repeat("x", 5000), Backend: be}, ErrInvalidExport},
		{"ok", Export{Name: "a", Backend: be}, nil},
		{"duplicate", Export{Name: "a", Backend: be}, ErrExportExists},
	}
	for _, tc := range cases {
		if err := s.AddExport(tc.e); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestNamesNeverLogged(t *testing.T) {
	log, lb := debugLogger()
	s := &Server{Logger: log}
	s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	addr := serveOn(t, s)
	c := dial(t, addr, testName)
	c.ReadAt(make([]byte, 512), 1<<20-512)
	c.do(context.Background(), CmdRead, 0, 1<<20, 512, nil, make([]byte, 512))
	c.Close()
	Dial(context.Background(), "tcp", addr, testName+"x")
	rc := rawDial(t, addr, 3)
	rc.optExpect(optList, nil)
	s.RemoveExport(testName)
	out := lb.String()
	if strings.Contains(out, "secret") || strings.Contains(out, testName) {
		t.Fatalf("export name leaked into the log:\n%s", out)
	}
	if !strings.Contains(out, NameTag(testName)) {
		t.Fatalf("log lacks the name tag:\n%s", out)
	}
}

func TestServeShutdown(t *testing.T) {
	s := &Server{}
	s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	c := dial(t, ln.Addr().String(), testName)
	rc := rawDial(t, ln.Addr().String(), 3) // stuck in the handshake
	_ = rc
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := c.ReadAt(make([]byte, 512), 0); err == nil {
		t.Fatal("connection survived shutdown")
	}
}

func TestURI(t *testing.T) {
	cases := []struct {
		in   string
		want URI
		err  bool
	}{
		{"nbd://127.0.0.1:1234/exp", URI{Network: "tcp", Address: "127.0.0.1:1234", Export: "exp"}, false},
		{"nbd://localhost/exp", URI{Network: "tcp", Address: "localhost:10809", Export: "exp"}, false},
		{"nbd://[::1]:99/", URI{Network: "tcp", Address: "[::1]:99"}, false},
		{"nbd://h:1/a%2Fb", URI{Network: "tcp", Address: "h:1", Export: "a/b"}, false},
		{"nbd+unix:///exp?socket=/tmp/s.sock", URI{Network: "unix", Address: "/tmp/s.sock", Export: "exp"}, false},
		{"nbd+unix:///exp", URI{}, true},
		{"nbds://h/exp", URI{Network: "tcp", Address: "h:10809", Export: "exp", TLS: true}, false},
		{"nbds://h:7/exp?tls-certificates=/etc/rialto/my%20certs", URI{Network: "tcp", Address: "h:7", Export: "exp", TLS: true,
			TLSCertificates: "/etc/rialto/my certs"}, false},
		{"nbds+unix:///e?socket=/run/s&tls-certificates=/d", URI{Network: "unix", Address: "/run/s", Export: "e", TLS: true,
			TLSCertificates: "/d"}, false},
		// tls-certificates means nothing without TLS (libnbd ignores it too).
		{"nbd://h:7/exp?tls-certificates=/d", URI{Network: "tcp", Address: "h:7", Export: "exp"}, false},
		{"nbds://h/exp?tls-psk-file=/k", URI{}, true},
		{"http://h/exp", URI{}, true},
		{"nbd:///exp", URI{}, true},
	}
	for _, tc := range cases {
		got, err := ParseURI(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseURI(%q) = %+v, %v", tc.in, got, err)
			continue
		}
		if err == nil {
			if back, _ := ParseURI(got.String()); back != got {
				t.Errorf("round trip %q -> %q -> %+v", tc.in, got.String(), back)
			}
		}
	}
}

func TestUnixSocketURI(t *testing.T) {
	s := &Server{}
	s.AddExport(Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	sock := t.TempDir() + "/nbd.sock"
	ln, err := netListen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	c, err := DialURI(ctx, URI{Network: "unix", Address: sock, Export: testName}.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Size() != 1<<20 {
		t.Fatal(c.Size())
	}
}

func TestRateLimit(t *testing.T) {
	now := time.Unix(1000, 0)
	rl := &RateLimit{BytesPerSec: 1 << 20, IOPS: 100, Burst: time.Second, Now: func() time.Time { return now }}
	if d := rl.Reserve(1 << 20); d != 0 {
		t.Fatalf("burst not honoured: %v", d)
	}
	if d := rl.Reserve(1 << 19); d != 500*time.Millisecond {
		t.Fatalf("debt wait %v", d)
	}
	now = now.Add(2 * time.Second)
	// 1.5 s of refill pays the debt and leaves a full-ish bucket; IOPS now binds.
	for i := 0; i < 100; i++ {
		rl.Reserve(0)
	}
	if d := rl.Reserve(0); d != 10*time.Millisecond {
		t.Fatalf("iops wait %v", d)
	}
	var none *RateLimit
	if none.Reserve(1<<40) != 0 {
		t.Fatal("nil limit limits")
	}
}

func TestRateLimitedExport(t *testing.T) {
	// 4 MiB/s with a 50 ms burst (~200 KiB), shared by two connections:
	// moving 1 MiB must take at least (1 MiB - burst) / rate ≈ 200 ms.
	rl := &RateLimit{BytesPerSec: 4 << 20, Burst: 50 * time.Millisecond}
	_, addr := startServer(t, Export{Name: testName, Backend: NewMemBackend(1 << 20), Limit: rl})
	c1 := dial(t, addr, testName)
	c2 := dial(t, addr, testName)
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range []*Client{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for off := i * 512 << 10; off < (i+1)*512<<10; off += len(buf) {
				if _, err := c.ReadAt(buf, int64(off)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("1 MiB at 4 MiB/s took only %v", d)
	}
}
