package nbd

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
)

// TestMoveWithheldPayload: a write over TLS decrypted straight into a
// tmpfs file's mapping, or in plaintext read into it (spliced into a
// file on disk), is under
// way (and untracked) from its header on, while its payload arrives. A
// client that sends the header and part of
// the payload and withholds the rest does not hold TrackWrites or
// PauseWrites until their context ends: after MoveWait the export's
// connections are closed, the write fails unanswered, and the rest of its
// payload, sent then, never lands.
func TestMoveWithheldPayload(t *testing.T) {
	for _, tc := range []struct {
		name string
		move func(ctx context.Context, s *Server, size int64) error
	}{
		{"TrackWrites", func(ctx context.Context, s *Server, size int64) error {
			return s.TrackWrites(ctx, testName, dirty.New(size, 4096))
		}},
		{"PauseWrites", func(ctx context.Context, s *Server, _ int64) error {
			return s.PauseWrites(ctx, testName)
		}},
	} {
		for _, useTLS := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/tls=%v", tc.name, useTLS), func(t *testing.T) {
				testMoveWithheldPayload(t, useTLS, tc.move)
			})
		}
	}
}

// moveKinds are the two waits of a move for the writes under way.
var moveKinds = []struct {
	name string
	move func(ctx context.Context, s *Server, d *dirty.Map) error
}{
	{"TrackWrites", func(ctx context.Context, s *Server, d *dirty.Map) error {
		return s.TrackWrites(ctx, testName, d)
	}},
	{"PauseWrites", func(ctx context.Context, s *Server, _ *dirty.Map) error {
		return s.PauseWrites(ctx, testName)
	}},
}

// withheld is a write whose payload the client holds back: its header
// and first bytes are sent, on a raw connection of export testName.
type withheld struct {
	s       *Server
	b       *FileBackend
	addr    string
	opts    []DialOption // for the export's other connections
	rc      *rawConn
	payload []byte // of the write at withheldOff; sent: its first withheldSent bytes
}

const (
	withheldSize          = 1 << 20
	withheldOff           = 64 << 10
	withheldLen           = 64 << 10
	withheldSent          = 4096
	withheldHandle uint64 = 1
)

// startWithheld serves a file of withheldSize bytes on tmpfs (where
// /dev/shm is one) with s (over TLS if useTLS) and sends on a raw
// connection a WRITE of withheldLen bytes with its first withheldSent
// bytes (0xa5), returning once those are in the file: the write is under
// way (read, or over TLS decrypted, into the file's mapping; spliced into
// it without tmpfs), untracked, waiting for the rest of its payload.
func startWithheld(t *testing.T, useTLS bool, s *Server) *withheld {
	t.Helper()
	pk := newTestPKI(t)
	path, b := sparseFile(t, fastDir(t), withheldSize)
	w := &withheld{s: s, b: b, payload: bytes.Repeat([]byte{0xa5}, withheldLen)}
	if useTLS {
		if !memoryBacked(t, path) {
			t.Skip("no tmpfs: writes are not decrypted into a mapping")
		}
		s.TLSConfig = pk.server
		w.opts = append(w.opts, WithTLS(pk.clientConfig()))
	}
	if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
		t.Fatal(err)
	}
	w.addr = serveOn(t, s)
	w.rc = rawDial(t, w.addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	if useTLS {
		w.rc.starttls(pk.clientConfig())
	}
	w.rc.goTransmission(testName, false, false)
	// The header and the first bytes in one write, so that the server
	// reads them together (in plaintext a splice that found the socket
	// empty would wait for the whole payload).
	w.rc.request(Request{Type: CmdWrite, Handle: withheldHandle, Offset: withheldOff, Length: withheldLen}, w.payload[:withheldSent])
	// The first bytes are in the file: the write is under way, reading
	// the rest of its payload into the file.
	got := make([]byte, withheldSent)
	waitFor(t, "the payload's first bytes in the file", func() bool {
		b.ReadAt(got, withheldOff)
		return bytes.Equal(got, w.payload[:withheldSent])
	})
	return w
}

// written is what the file holds where the withheld write goes.
func (w *withheld) written() []byte {
	got := make([]byte, withheldLen)
	w.b.ReadAt(got, withheldOff)
	return got
}

// conn is the server's connection of the withheld write (the export's
// only one when it is called).
func (w *withheld) conn(t *testing.T) *conn {
	t.Helper()
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	for c := range w.s.exports[testName].conns {
		if len(w.s.exports[testName].conns) != 1 {
			t.Fatalf("%d connections", len(w.s.exports[testName].conns))
		}
		return c
	}
	t.Fatal("no connection")
	return nil
}

// stopped checks that the withheld write's connection was closed: the
// rest of its payload, sent now, never lands nor is answered.
func (w *withheld) stopped(t *testing.T) {
	t.Helper()
	before := w.written()
	w.rc.c.Write(w.payload[withheldSent:])
	if r, err := w.rc.reply(0); err == nil {
		t.Fatalf("the withheld write was answered: %+v", r)
	}
	if !bytes.Equal(w.written(), before) {
		t.Fatal("the withheld write's payload landed after the move stopped it")
	}
}

func testMoveWithheldPayload(t *testing.T, useTLS bool, move func(ctx context.Context, s *Server, size int64) error) {
	w := startWithheld(t, useTLS, &Server{MoveWait: 50 * time.Millisecond})
	s := w.s
	m0 := tlsMappedWrites.Load()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	if err := move(ctx, s, withheldSize); err != nil {
		t.Fatalf("the move = %v after %v", err, time.Since(start))
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the move waited %v for a withheld payload", d)
	}
	// The rest of the payload now: the write has ended and never
	// lands, nor is answered; the connection is closed.
	w.stopped(t)
	if !bytes.Equal(w.written()[withheldSent:], make([]byte, withheldLen-withheldSent)) {
		t.Fatal("the withheld write's payload landed after the move stopped it")
	}
	if tlsMappedWrites.Load() != m0 {
		t.Fatal("the withheld write was counted as written")
	}
	if err := s.EndMove(testName); err != nil {
		t.Fatal(err)
	}
	// The export is served to the client's next connection.
	c := dial(t, w.addr, testName, w.opts...)
	if _, err := c.WriteAt(w.payload, withheldOff); err != nil {
		t.Fatal(err)
	}
}

// TestMoveClosesOnlyTheWithholdingConnection: a move that gives up on a
// withheld payload closes that write's connection, and only it: the
// export's other connections are served on, a read at once, a write held
// by the pause until it is lifted (or, while the move tracks, marked).
// It closed every connection of the export.
func TestMoveClosesOnlyTheWithholdingConnection(t *testing.T) {
	for _, mk := range moveKinds {
		for _, useTLS := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/tls=%v", mk.name, useTLS), func(t *testing.T) {
				w := startWithheld(t, useTLS, &Server{MoveWait: 50 * time.Millisecond})
				s := w.s
				other := dial(t, w.addr, testName, w.opts...)
				buf := make([]byte, 4096)
				if _, err := other.ReadAt(buf, 0); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				d := dirty.New(withheldSize, 4096)
				if err := mk.move(ctx, s, d); err != nil {
					t.Fatal(err)
				}
				w.stopped(t)
				waitFor(t, "the withholding connection to end", func() bool { return s.Connections(testName) < 2 })
				if n := s.Connections(testName); n != 1 {
					t.Fatalf("%d connections left, want the other one", n)
				}

				// The other connection is served on.
				if _, err := other.ReadAt(buf, withheldOff); err != nil {
					t.Fatalf("the other connection's read after the move gave up: %v", err)
				}
				const off2 = 4 * withheldOff
				data := bytes.Repeat([]byte{0x5a}, 4096)
				if mk.name == "PauseWrites" {
					werr := make(chan error, 1)
					go func() {
						_, err := other.WriteAt(data, off2)
						werr <- err
					}()
					waitFor(t, "the other connection's write to be held", func() bool { return s.HeldWrites(testName) == 1 })
					if err := s.ResumeWrites(testName); err != nil {
						t.Fatal(err)
					}
					if err := <-werr; err != nil {
						t.Fatalf("the other connection's held write: %v", err)
					}
				} else {
					if _, err := other.WriteAt(data, off2); err != nil {
						t.Fatalf("the other connection's write: %v", err)
					}
					if r := d.Take(); len(r) == 0 || r[len(r)-1] != (dirty.Range{Off: off2, Len: 4096}) {
						t.Errorf("dirty = %v, want the other connection's write last", r)
					}
				}
				got := make([]byte, len(data))
				w.b.ReadAt(got, off2)
				if !bytes.Equal(got, data) {
					t.Error("the other connection's write is not in the file")
				}
				if err := s.EndMove(testName); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// trickleChunk is how much of the withheld payload trickle sends at once.
const trickleChunk = 2048

// sendChunk sends the withheld write's payload at at, trickleChunk bytes,
// and waits until they reach the server (the count c.Writing reports
// grows); the move (done) must not return meanwhile. It returns where the
// payload goes on.
func (w *withheld) sendChunk(t *testing.T, c *conn, at int, done <-chan error) int {
	t.Helper()
	if at+trickleChunk >= withheldLen {
		t.Fatal("the payload ran out")
	}
	_, rcv := c.Writing(true)
	w.rc.write(w.payload[at : at+trickleChunk])
	waitFor(t, "the chunk to reach the server", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the move returned (%v) with the write's payload arriving", err)
		default:
		}
		busy, n := c.Writing(true)
		return busy && n > rcv
	})
	return at + trickleChunk
}

// trickle sends the withheld write's payload from at, a chunk per step of
// fc, until step would take fc to until (from t0) or beyond; the move
// (done) must not return meanwhile. It returns where it stopped.
func (w *withheld) trickle(t *testing.T, c *conn, fc *clock.Fake, t0 time.Time, at int, step, until time.Duration, done <-chan error) int {
	t.Helper()
	for fc.Since(t0)+step < until {
		at = w.sendChunk(t, c, at, done)
		fc.Advance(step)
	}
	return at
}

// startMove starts move (a moveKinds') of w's export and returns once it
// waits on fc, the server's clock; the channel gets its outcome.
func (w *withheld) startMove(t *testing.T, fc *clock.Fake, move func(ctx context.Context, s *Server, d *dirty.Map) error) <-chan error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- move(ctx, w.s, dirty.New(withheldSize, 4096)) }()
	if err := fc.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return done
}

// TestMoveWaitsWhileThePayloadArrives: a write whose payload arrives
// slowly, a chunk every 3/4 of MoveWait, is waited for well past MoveWait
// (the fake clock's): the move returns once it has completed, answered
// and in the file. The move gave up on it after MoveWait, as on a
// withheld one.
func TestMoveWaitsWhileThePayloadArrives(t *testing.T) {
	for _, mk := range moveKinds {
		for _, useTLS := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/tls=%v", mk.name, useTLS), func(t *testing.T) {
				t0 := time.Unix(1e9, 0)
				fc := clock.NewFake(t0)
				const wait = time.Second
				w := startWithheld(t, useTLS, &Server{MoveWait: wait, Clock: fc})
				c := w.conn(t)
				done := w.startMove(t, fc, mk.move)
				at := w.trickle(t, c, fc, t0, withheldSent, wait*3/4, 6*wait, done)
				w.rc.write(w.payload[at:])
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				r, err := w.rc.reply(0)
				if err != nil || r.errno != 0 || r.handle != withheldHandle {
					t.Fatalf("the slow write's reply: %+v, %v", r, err)
				}
				if !bytes.Equal(w.written(), w.payload) {
					t.Error("the slow write is not in the file")
				}
				if err := w.s.EndMove(testName); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestMoveWaitLimit: a write whose payload trickles in is waited for up to
// MoveWaitLimit only: its connection is closed then, and the rest of its
// payload never lands.
func TestMoveWaitLimit(t *testing.T) {
	for _, mk := range moveKinds {
		for _, useTLS := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/tls=%v", mk.name, useTLS), func(t *testing.T) {
				t0 := time.Unix(1e9, 0)
				fc := clock.NewFake(t0)
				const wait, limit = time.Second, 4 * time.Second
				w := startWithheld(t, useTLS, &Server{MoveWait: wait, MoveWaitLimit: limit, Clock: fc})
				c := w.conn(t)
				done := w.startMove(t, fc, mk.move)
				at := w.trickle(t, c, fc, t0, withheldSent, wait*3/4, limit, done)
				// One more chunk: the limit runs out within this step.
				w.sendChunk(t, c, at, done)
				fc.Advance(wait * 3 / 4)
				if fc.Since(t0) < limit {
					t.Fatalf("the fake clock is at %v, before the limit", fc.Since(t0))
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				w.stopped(t)
				if err := w.s.EndMove(testName); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
