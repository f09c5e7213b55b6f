package stripe

import (
	"bytes"
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
		p := newPart(c, u, nil, nil, 0, 10*time.Second, 5*time.Second, resolve, slog.New(slog.DiscardHandler))
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

// TestWriteBackRetryKeepsOrder: a write acknowledged early whose
// connection drops before the lender had it is retried on a new
// connection; a later write overlapping it (from another client
// connection) waits for that retry, so the lender ends with the later
// bytes, and a FLUSH in the meantime covers the retried write.
func TestWriteBackRetryKeepsOrder(t *testing.T) {
	l := startLender(t, 4<<20)
	bh := newBlackhole(t, l.ln.Addr().String())
	u, _ := nbd.ParseURI(l.uri)
	u.Address = bh.ln.Addr().String()
	a := attach(t, AttachConfig{URIs: []string{u.String()}, RequestTimeout: 20 * time.Second, RedialTimeout: 10 * time.Second, WriteBack: true})
	// Three client connections: the local export may serve a request
	// in its connection's reader, so that one waiting holds the next.
	c1, c2, c3 := dialAttachment(t, a), dialAttachment(t, a), dialAttachment(t, a)
	bh.freeze()
	if _, err := c1.WriteAt(pattern(4096, 0x11), 0); err != nil {
		t.Fatalf("write: %v (it is acknowledged once sent)", err)
	}
	bh.mu.Lock() // the lender's host drops the connections, unanswered
	for _, nc := range bh.conns {
		nc.Close()
	}
	bh.mu.Unlock()
	later := make(chan error, 1)
	go func() {
		_, err := c2.WriteAt(pattern(4096, 0x22), 2048)
		later <- err
	}()
	flushed := make(chan error, 1)
	go func() { flushed <- c3.Flush() }()
	waitFor(t, "the overlapping write and the flush to wait for the retried one", func() bool {
		k, w := a.wb.state()
		return k == 1 && w == 2
	})
	bh.mu.Lock()
	bh.frozen = false // the host is back: the redial gets through
	bh.mu.Unlock()
	if err := <-later; err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("flush: %v", err)
	}
	if err := c1.Flush(); err != nil {
		t.Fatal(err)
	}
	want := append(pattern(2048, 0x11), pattern(4096, 0x22)...)
	got := make([]byte, len(want))
	l.mem.ReadAt(got, 0) // under the memory's lock: TCP orders nothing for the race detector
	if !bytes.Equal(got, want) {
		t.Fatalf("the lender holds %x… at 0, %x… at 2048; want the later write over the retried one", got[:4], got[2048:2052])
	}
}

// TestLateWriteCoveredByFlush: a write the lender answered, whose caller
// counts it only after a flush sent on the same connection after that
// answer succeeded, and after the lender then restarted and another call
// reconnected (which looks for unflushed writes then), is not reported
// lost: that flush covered it. Also through a pool whose one flush is
// sent on its other connection (multi-conn); without the flush, the loss
// is reported.
func TestLateWriteCoveredByFlush(t *testing.T) {
	for _, tc := range []struct {
		name        string
		pool, flush bool
	}{{"part", false, true}, {"pool", true, true}, {"pool unflushed", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			be := &countingBackend{MemBackend: nbd.NewMemBackend(1 << 20), multiConn: true}
			l := startLenderWith(t, be)
			n := 1
			if tc.pool {
				n = 2
			}
			pool, parts := poolOf(t, l, n)
			var dev Device = parts[0]
			if tc.pool {
				dev = pool
			}
			p := parts[0]
			var once sync.Once
			p.beforeCount = func() {
				once.Do(func() {
					if tc.flush {
						if err := dev.Flush(); err != nil {
							t.Errorf("flush while the write is answered, not counted: %v", err)
						}
						if tc.pool && parts[1].flushed.Load() != 0 {
							t.Errorf("the pool's flush was not one flush on its other connection")
						}
					}
					l.kill()
					l.restartOnSamePort(t)
					if _, err := p.ReadAt(make([]byte, 8), 0); err != nil { // reconnects
						t.Errorf("read after the restart: %v", err)
					}
				})
			}
			if _, err := dev.WriteAt([]byte("answered, then flushed"), 0); err != nil {
				t.Fatal(err)
			}
			err := dev.Flush()
			if want := !tc.flush; errors.Is(err, ErrLostWrites) != want || (!want && err != nil) {
				t.Fatalf("flush after the restart = %v, want ErrLostWrites: %v", err, want)
			}
			if err := dev.Flush(); err != nil {
				t.Fatalf("second flush: %v", err)
			}
		})
	}
}
