package stripe

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestStartWriteRedialsOffCaller: a write started on a part whose
// connection is already broken (StartWrite fails at once), while its lender
// is down, does not hold the caller — the local export's reader, which
// would stop reading every request of its client — for the redial:
// startWrite returns while the lender is still down, the write stays in
// flight (the Pool counts it) until the part has redialled the lender once
// it is back and written it there, and then done reports success. Also
// for a write larger than the lender takes in one request, which is
// written synchronously (nbd.ErrTooLarge).
func TestStartWriteRedialsOffCaller(t *testing.T) {
	const (
		size     = 1 << 20
		maxBlock = 64 << 10
	)
	for _, tc := range []struct {
		name string
		n    int
	}{{"small", 4096}, {"too large", 2 * maxBlock}} {
		t.Run(tc.name, func(t *testing.T) {
			mem := nbd.NewMemBackend(size)
			l := startLenderMaxBlock(t, mem, maxBlock)
			u, err := nbd.ParseURI(l.uri)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c, err := nbd.Dial(ctx, u.Network, u.Address, u.Export)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			// A redial far longer than the test waits for startWrite:
			// blocking on it cannot pass for returning promptly.
			p := newPart(c, u, nil, nil, 0, 10*time.Second, 30*time.Second, nil, slog.New(slog.DiscardHandler))
			t.Cleanup(func() { p.Close() })
			pool, err := NewPool(p)
			if err != nil {
				t.Fatal(err)
			}

			// The lender dies, and the connection has noticed: a
			// write cannot even be sent on it.
			l.kill()
			if err := c.Flush(); err == nil {
				t.Fatal("flush on a killed lender's connection succeeded")
			}
			if err := c.StartWrite(make([]byte, 512), 0, func(error) {}); !errors.Is(err, nbd.ErrClosed) {
				t.Fatalf("StartWrite on the broken connection = %v, want ErrClosed at once", err)
			}

			data := pattern(tc.n, 0x5A)
			const off = 8192
			wseq := p.wseq.Load()
			returned := make(chan struct{})
			result := make(chan error, 1)
			go func() {
				pool.startWrite(data, off, func(err error) { result <- err })
				close(returned)
			}()
			select {
			case <-returned:
			case <-time.After(5 * time.Second):
				t.Fatal("startWrite did not return while its part redialled a lender that is down")
			}
			select {
			case err := <-result:
				t.Fatalf("done(%v) before the lender was back", err)
			default:
			}
			if n := pool.inflight[0].Load(); n != 1 {
				t.Fatalf("pool counts %d writes in flight during the redial, want 1", n)
			}

			l.restartOnSamePort(t)
			select {
			case err := <-result:
				if err != nil {
					t.Fatalf("write retried after the lender came back: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("done was not called after the lender came back")
			}
			if n := pool.inflight[0].Load(); n != 0 {
				t.Errorf("pool counts %d writes in flight after done, want 0", n)
			}
			if got := p.wseq.Load() - wseq; got != 1 {
				t.Errorf("wseq grew by %d for one write, want 1", got)
			}
			got := make([]byte, tc.n)
			if _, err := mem.ReadAt(got, off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("the lender lacks the write")
			}
		})
	}
}
