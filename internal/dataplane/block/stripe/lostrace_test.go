package stripe

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestLostWriteCountedDuringReconnect: a write the lender answered just
// before it restarted, whose caller counts it only after another call on
// the part has found the connection broken and reconnected (which looks
// for unflushed writes then), is still reported lost by the next flush;
// but not when the reconnection found the part moved (its writes were
// copied).
func TestLostWriteCountedDuringReconnect(t *testing.T) {
	for _, moved := range []bool{false, true} {
		l := startLender(t, 1<<20)
		dst := startLender(t, 1<<20)
		u, err := nbd.ParseURI(l.uri)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		at := l.uri
		resolve := func(context.Context, int) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return at, nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := u.Dial(ctx, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		p := newPart(c, u, nil, 0, 10*time.Second, 5*time.Second, resolve, slog.New(slog.DiscardHandler))
		t.Cleanup(func() { p.Close() })
		var once sync.Once
		p.beforeCount = func() {
			once.Do(func() {
				l.kill()
				if moved {
					mu.Lock()
					at = dst.uri
					mu.Unlock()
				} else {
					l.restartOnSamePort(t)
				}
				if _, err := p.ReadAt(make([]byte, 8), 0); err != nil { // reconnects
					t.Errorf("moved=%v: read after the restart: %v", moved, err)
				}
			})
		}
		if _, err := p.WriteAt([]byte("answered, then lost"), 0); err != nil {
			t.Fatal(err)
		}
		err = p.Flush()
		if want := !moved; errors.Is(err, ErrLostWrites) != want || (!want && err != nil) {
			t.Fatalf("moved=%v: flush after the lender went away with an answered write = %v, want ErrLostWrites: %v", moved, err, want)
		}
		if err := p.Flush(); err != nil {
			t.Fatalf("moved=%v: second flush: %v", moved, err)
		}
	}
}
