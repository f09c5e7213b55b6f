package nbd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestClientManyInFlight has many goroutines share one Client, each
// writing, reading back and overwriting its own region with requests of
// varied sizes (header-only reads and writes with payloads, queued while
// another caller is writing and sent together): every reply must reach
// its own caller with its own bytes, and the export must hold exactly
// what was written last.
func TestClientManyInFlight(t *testing.T) {
	const (
		workers = 48
		region  = 128 << 10
		rounds  = 12
	)
	mem := NewMemBackend(workers * region)
	_, addr := startServer(t, Export{Name: testName, Backend: mem})
	c := dial(t, addr, testName)
	want := make([]byte, workers*region)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(w), 7))
			base := int64(w) * region
			for round := range rounds {
				n := 1 + rng.IntN(region/2)
				off := base + int64(rng.IntN(region-n))
				p := want[off : off+int64(n)]
				for i := range p {
					p[i] = byte(w*31 + round*7 + i) // this worker, this round
				}
				if _, err := c.WriteAt(p, off); err != nil {
					errs <- fmt.Errorf("worker %d write: %w", w, err)
					return
				}
				got := make([]byte, region)
				var err error
				if w%2 == 0 {
					_, err = c.ReadAt(got, base)
				} else {
					// Cancellable callers wait on the background reader.
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_, err = c.ReadAtContext(ctx, got, base)
					cancel()
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d read: %w", w, err)
					return
				}
				if !bytes.Equal(got, want[base:base+region]) {
					errs <- fmt.Errorf("worker %d round %d: read back other bytes than written", w, round)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// Through another connection: the export holds the last writes.
	got := make([]byte, len(want))
	if _, err := dial(t, addr, testName).ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the export holds other bytes than the last writes")
	}
}

// TestClientStallFailsEveryCaller: with many requests in flight (callers
// reading for themselves, cancellable ones, writes), a server that stops
// answering fails every one of them with ErrTimeout, from the
// connection's one watchdog, within a bound.
func TestClientStallFailsEveryCaller(t *testing.T) {
	addr := drainServer(t)
	const timeout = 300 * time.Millisecond
	c := dial(t, addr, testName, WithRequestTimeout(timeout))
	const callers = 16
	errc := make(chan error, callers)
	start := time.Now()
	for i := range callers {
		go func() {
			var err error
			switch i % 3 {
			case 0:
				_, err = c.ReadAt(make([]byte, 4096), 0)
			case 1:
				_, err = c.ReadAtContext(context.Background(), make([]byte, 4096), 0)
			default:
				_, err = c.WriteAt(make([]byte, 8192), 0)
			}
			errc <- err
		}()
	}
	for range callers {
		select {
		case err := <-errc:
			// A request sent after the watchdog fired reports the
			// connection's terminal error, which is ErrTimeout too.
			if !errors.Is(err, ErrTimeout) {
				t.Errorf("err %v, want ErrTimeout", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a caller hung on a stalled server")
		}
	}
	if d := time.Since(start); d < timeout {
		t.Errorf("failed after %v, before the %v timeout", d, timeout)
	}
}

func TestWatchdogPeriod(t *testing.T) {
	for _, tc := range []struct{ timeout, want time.Duration }{
		{time.Microsecond, time.Millisecond},
		{300 * time.Millisecond, 75 * time.Millisecond},
		{30 * time.Second, time.Second},
	} {
		if got := watchdogPeriod(tc.timeout); got != tc.want {
			t.Errorf("watchdogPeriod(%v) = %v, want %v", tc.timeout, got, tc.want)
		}
	}
}

// drainServer completes the handshake, then reads every request and
// answers none, until the client goes away.
func drainServer(t *testing.T) string {
	return handshakeServer(t, func(r *bufio.Reader) { io.Copy(io.Discard, r) })
}
