package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestExportConnsBounded: one tenant opens more connections to its export
// than Server.MaxExportConns, each of those served sending large reads it
// never reads the replies of (what each may hold, up to 64 MiB of buffers,
// its reader's budget). The connections past the bound are refused at
// NBD_OPT_GO with NBD_REP_ERR_POLICY and a message (the option phase goes
// on: the client may abort, or try again), at NBD_OPT_EXPORT_NAME hung up
// on; the export serves the bound's number, and a refused client is
// served once one of them has ended. Plaintext and over TLS.
func TestExportConnsBounded(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		name := "plain"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			const limit = 3
			var p *testPKI
			s := &Server{MaxExportConns: limit}
			if useTLS {
				p = newTestPKI(t)
				s.TLSConfig = p.server
			}
			if err := s.AddExport(Export{Name: testName, Backend: NewMemBackend(32 << 20)}); err != nil {
				t.Fatal(err)
			}
			addr := serveOn(t, s)
			open := func() *rawConn {
				rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
				// Little room on this side: the replies stay queued at
				// the server, their buffers held.
				if err := rc.c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
					t.Fatal(err)
				}
				if useTLS {
					rc.starttls(p.clientConfig())
				}
				return rc
			}
			var served []*rawConn
			for i := 0; i < limit; i++ {
				rc := open()
				rc.goTransmission(testName, true, false)
				for h := uint64(1); h <= 2; h++ {
					rc.request(Request{Type: CmdRead, Handle: h, Offset: 0, Length: 8 << 20}, nil)
				}
				served = append(served, rc)
			}
			// The server counts a connection once it has sent the
			// handshake's last reply, which the client may read first.
			waitFor(t, "the served connections to be counted", func() bool { return s.Connections(testName) == limit })
			for i := 0; i < 3; i++ {
				rc := open()
				rc.opt(optGo, infoData(testName, infoBlockSize))
				_, typ, msg, err := rc.optReply()
				if err != nil {
					t.Fatalf("connection %d past the bound: %v", limit+i, err)
				}
				if typ != repErrPolicy || !strings.Contains(string(msg), "connections") {
					t.Fatalf("connection %d past the bound: NBD_OPT_GO answered %#x %q, want NBD_REP_ERR_POLICY", limit+i, typ, msg)
				}
				// Still in the option phase: it may leave cleanly.
				if got := rc.optExpect(optAbort, nil); len(got) != 1 || got[0] != repAck {
					t.Fatalf("abort after the refusal: %x", got)
				}
			}
			if !useTLS {
				rc := open()
				rc.opt(optExportName, []byte(testName))
				if !rc.closed() {
					t.Fatal("NBD_OPT_EXPORT_NAME past the bound: no hang-up")
				}
			}
			if n := s.Connections(testName); n != limit {
				t.Fatalf("%d connections in transmission, want %d", n, limit)
			}

			// One served connection leaves: a refused client's retry
			// gets in (each try is a round trip; no sleep).
			served[0].c.Close()
			deadline := time.Now().Add(10 * time.Second)
			for {
				rc := open()
				rc.opt(optGo, infoData(testName, infoBlockSize))
				ok := false
				for {
					_, typ, _, err := rc.optReply()
					if err != nil {
						t.Fatal(err)
					}
					if typ == repAck {
						ok = true
					}
					if typ == repAck || typ&repErrBit != 0 {
						break
					}
				}
				if ok {
					break
				}
				rc.c.Close()
				if time.Now().After(deadline) {
					t.Fatal("no room on the export after a connection ended")
				}
			}
		})
	}
}

// TestHandshakesBounded: peers that open connections and stall in the
// option phase (some before any option, some in the middle of the TLS
// handshake after NBD_OPT_STARTTLS) never have more than
// Server.MaxHandshakes option phases held at once: each connection past
// the bound has the longest-waiting one closed to make room, and a
// client that completes its handshake promptly is served at once.
func TestHandshakesBounded(t *testing.T) {
	const limit = 4
	p := newTestPKI(t)
	s := &Server{MaxHandshakes: limit, TLSConfig: p.server}
	be := NewMemBackend(1 << 20)
	if err := s.AddExport(Export{Name: testName, Backend: be}); err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, s)
	const stalled = 3 * limit
	var rcs []*rawConn
	for i := 0; i < stalled; i++ {
		// rawDial returns once the server has sent its greeting: this
		// connection holds an option phase.
		rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
		if i%2 == 1 {
			// STARTTLS acknowledged, then no ClientHello: the server
			// waits in the TLS handshake.
			if got := rc.optExpect(optStartTLS, nil); len(got) != 1 || got[0] != repAck {
				t.Fatalf("STARTTLS: %x", got)
			}
		}
		rcs = append(rcs, rc)
		if st := s.Handshakes(); st.Active > limit || st.Peak > limit {
			t.Fatalf("after %d stalled connections: %+v, want at most %d", i+1, st, limit)
		}
	}
	// The oldest were closed to make room, in the order they came.
	for i, rc := range rcs[:stalled-limit] {
		if !rc.closed() {
			t.Fatalf("stalled connection %d still open", i)
		}
	}
	if st := s.Handshakes(); st.Evicted != stalled-limit || st.Peak != limit {
		t.Fatalf("handshakes %+v: want %d closed to make room, peak %d", st, stalled-limit, limit)
	}

	// A client that gets through its handshake is served at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "tcp", addr, testName, WithTLS(p.clientConfig()))
	if err != nil {
		t.Fatalf("a client behind %d stalled handshakes: %v", stalled, err)
	}
	defer c.Close()
	want := bytes.Repeat([]byte{7}, 4096)
	if _, err := c.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := c.ReadAtContext(ctx, got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, want))
	}
	if st := s.Handshakes(); st.Peak > limit {
		t.Fatalf("handshakes %+v: peak above %d", st, limit)
	}
}

// TestOptionTooBig: option data past what the server holds is read past
// and refused with NBD_REP_ERR_TOO_BIG; the option phase goes on. An
// export name past the spec's 4096 bytes ends the connection (that option
// has no error reply).
func TestOptionTooBig(t *testing.T) {
	_, addr := startServer(t, Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.opt(optStructuredReply, nil)
	if _, typ, _, err := rc.optReply(); err != nil || typ != repAck {
		t.Fatalf("structured replies: %#x %v", typ, err)
	}
	queries := []string{strings.Repeat("q", maxNameLen), strings.Repeat("r", maxNameLen), strings.Repeat("s", maxNameLen),
		strings.Repeat("t", maxNameLen), MetaContextBaseAllocation}
	rc.opt(optListMetaContext, metaData(testName, queries...))
	_, typ, msg, err := rc.optReply()
	if err != nil || typ != repErrTooBig {
		t.Fatalf("oversized option: %#x %q %v, want NBD_REP_ERR_TOO_BIG", typ, msg, err)
	}
	// The largest option a client needs is taken: a name and a query of
	// the spec's longest.
	name := strings.Repeat("n", maxNameLen)
	if got := rc.optExpect(optListMetaContext, metaData(name, strings.Repeat("q", maxNameLen))); got[len(got)-1] != repErrUnknown {
		t.Fatalf("longest names: %x, want NBD_REP_ERR_UNKNOWN", got)
	}
	rc.goTransmission(testName, false, true)

	rc = rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	b := binary.BigEndian.AppendUint64(nil, optMagic)
	b = binary.BigEndian.AppendUint32(b, optExportName)
	b = binary.BigEndian.AppendUint32(b, maxNameLen+1)
	rc.write(append(b, make([]byte, maxNameLen+1)...))
	if !rc.closed() {
		t.Fatal("export name past 4096 bytes: no hang-up")
	}
}

// TestPipelinedAfterExportName: requests a client sends right behind its
// NBD_OPT_EXPORT_NAME, read ahead by the option phase's small buffer,
// are served in the transmission phase (its larger buffer takes them
// over), a large write among them.
func TestPipelinedAfterExportName(t *testing.T) {
	be := NewMemBackend(1 << 20)
	_, addr := startServer(t, Export{Name: testName, Backend: be})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	b := binary.BigEndian.AppendUint64(nil, optMagic)
	b = binary.BigEndian.AppendUint32(b, optExportName)
	b = binary.BigEndian.AppendUint32(b, uint32(len(testName)))
	b = append(b, testName...)
	small := bytes.Repeat([]byte{3}, 512)
	large := bytes.Repeat([]byte{5}, 256<<10)
	req := make([]byte, requestHeaderLen)
	putRequest(req, Request{Type: CmdWrite, Handle: 1, Offset: 0, Length: uint32(len(small))})
	b = append(append(b, req...), small...)
	putRequest(req, Request{Type: CmdWrite, Handle: 2, Offset: 4096, Length: uint32(len(large))})
	b = append(append(b, req...), large...)
	rc.write(b)
	var hdr [10]byte
	if _, err := io.ReadFull(rc.r, hdr[:]); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		r, err := rc.reply(0)
		if err != nil || r.errno != 0 {
			t.Fatalf("write reply %d: %v (errno %d)", i, err, r.errno)
		}
	}
	for _, w := range []struct {
		off  int64
		want []byte
	}{{0, small}, {4096, large}} {
		got := make([]byte, len(w.want))
		if _, err := be.ReadAt(got, w.off); err != nil || !bytes.Equal(got, w.want) {
			t.Fatalf("at %d: %v, equal %v", w.off, err, bytes.Equal(got, w.want))
		}
	}
}
