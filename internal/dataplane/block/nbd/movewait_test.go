package nbd

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
)

// TestMoveWithheldPayload: a write over TLS decrypted straight into a
// tmpfs file's mapping, or in plaintext spliced into the file, is under
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

func testMoveWithheldPayload(t *testing.T, useTLS bool, move func(ctx context.Context, s *Server, size int64) error) {
	const size = 1 << 20
	pk := newTestPKI(t)
	path, b := sparseFile(t, fastDir(t), size)
	s := &Server{MoveWait: 50 * time.Millisecond}
	var opts []DialOption
	if useTLS {
		if !memoryBacked(t, path) {
			t.Skip("no tmpfs: writes are not decrypted into a mapping")
		}
		s.TLSConfig = pk.server
		opts = append(opts, WithTLS(pk.clientConfig()))
	}
	if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, s)
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	if useTLS {
		rc.starttls(pk.clientConfig())
	}
	rc.goTransmission(testName, false, false)

	const off, n, sent = 64 << 10, 64 << 10, 4096
	payload := bytes.Repeat([]byte{0xa5}, n)
	// The header and the first bytes in one write, so that the server
	// reads them together (in plaintext a splice that found the socket
	// empty would wait for the whole payload).
	rc.request(Request{Type: CmdWrite, Handle: 1, Offset: off, Length: n}, payload[:sent])
	// The first bytes are in the file: the write is under way,
	// reading the rest of its payload into the mapping.
	got := make([]byte, n)
	waitFor(t, "the payload's first bytes in the file", func() bool {
		b.ReadAt(got, off)
		return bytes.Equal(got[:sent], payload[:sent])
	})
	m0 := tlsMappedWrites.Load()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	if err := move(ctx, s, size); err != nil {
		t.Fatalf("the move = %v after %v", err, time.Since(start))
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the move waited %v for a withheld payload", d)
	}
	// The rest of the payload now: the write has ended and never
	// lands, nor is answered; the connection is closed.
	rc.c.Write(payload[sent:])
	if r, err := rc.reply(0); err == nil {
		t.Fatalf("the withheld write was answered: %+v", r)
	}
	b.ReadAt(got, off)
	if !bytes.Equal(got[sent:], make([]byte, n-sent)) {
		t.Fatal("the withheld write's payload landed after the move stopped it")
	}
	if tlsMappedWrites.Load() != m0 {
		t.Fatal("the withheld write was counted as written")
	}
	if err := s.EndMove(testName); err != nil {
		t.Fatal(err)
	}
	// The export is served to the client's next connection.
	c := dial(t, addr, testName, opts...)
	if _, err := c.WriteAt(payload, off); err != nil {
		t.Fatal(err)
	}
}
