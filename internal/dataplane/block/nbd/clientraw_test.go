package nbd

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestClientRawSocket: a plaintext client (TCP and Unix socket) leaves the
// netpoller after the handshake, a caller alone in flight waits for its
// reply in poll(2), and reads, writes and flushes come back right, at
// queue depth 1 and beside concurrent callers (whose waits go through the
// netpoller); after them a lone caller waits in poll(2) again. A TLS
// client stays on crypto/tls (TestTLSOptionRules).
func TestClientRawSocket(t *testing.T) {
	const size = 1 << 20
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			be := NewMemBackend(size)
			s := &Server{}
			if err := s.AddExport(Export{Name: testName, Backend: be}); err != nil {
				t.Fatal(err)
			}
			addr := serveOn(t, s)
			if network == "unix" {
				addr = filepath.Join(t.TempDir(), "nbd.sock")
				ln, err := net.Listen("unix", addr)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); s.Serve(ctx, ln) }()
				t.Cleanup(func() { cancel(); <-done })
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c, err := Dial(ctx, network, addr, testName)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.rs == nil {
				t.Fatalf("plaintext %s client on %T, not on a raw socket", network, c.nc)
			}

			// Connections of earlier tests end asynchronously.
			waitServedAlone(t)
			waits := clientRawWaits.Load()
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(i * 7)
			}
			for off := 0; off < size; off += 64 << 10 {
				if _, err := c.WriteAt(want[off:off+64<<10], int64(off)); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 8192)
			for i := range 50 {
				off := int64(i*12289) % (size - 8192)
				if _, err := c.ReadAt(buf, off); err != nil || !bytes.Equal(buf, want[off:off+8192]) {
					t.Fatalf("read %d at %d: %v", i, off, err)
				}
			}
			if got := clientRawWaits.Load() - waits; got == 0 {
				t.Fatal("no caller waited in poll(2) at queue depth 1")
			}

			// Many callers at once: replies reach the right callers.
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					b := make([]byte, 4096)
					for i := range 100 {
						off := int64((g*100+i)*4096) % size
						if _, err := c.ReadAt(b, off); err != nil || !bytes.Equal(b, want[off:off+4096]) {
							t.Errorf("caller %d read %d: %v", g, i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			// The background reader lets go just after it completes the
			// last call.
			deadline := time.Now().Add(10 * time.Second)
			for {
				c.mu.Lock()
				reading := c.reading
				c.mu.Unlock()
				if !reading {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the background reader still reads with nothing pending")
				}
				time.Sleep(time.Millisecond)
			}
			waits = clientRawWaits.Load()
			if _, err := c.ReadAt(buf, 4096); err != nil || !bytes.Equal(buf, want[4096:4096+8192]) {
				t.Fatalf("lone read after the crowd: %v", err)
			}
			if clientRawWaits.Load() == waits {
				t.Fatal("a lone caller after the crowd did not wait in poll(2)")
			}
			if c.rs.polled() {
				t.Fatal("the socket is still registered with the netpoller after a raw wait")
			}

			// A second connection served: callers keep to the netpoller.
			ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
			c2, err := Dial(ctx, network, addr, testName)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			deadline = time.Now().Add(10 * time.Second)
			for servedAlone() {
				if time.Now().After(deadline) {
					t.Fatal("the second connection never counted as served")
				}
				time.Sleep(time.Millisecond)
			}
			waits = clientRawWaits.Load()
			for range 20 {
				if _, err := c.ReadAt(buf, 4096); err != nil || !bytes.Equal(buf, want[4096:4096+8192]) {
					t.Fatalf("read beside a second connection: %v", err)
				}
			}
			if n := clientRawWaits.Load() - waits; n != 0 {
				t.Fatalf("%d waits in poll(2) while the process served two connections", n)
			}
			c2.Close()
		})
	}
}

// waitServedAlone waits until the process serves at most one connection.
func waitServedAlone(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !servedAlone() {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections in transmission, %d of them dialled", transmitting.Load(), dialled.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// stalledReads holds every read until release is closed.
type stalledReads struct {
	*MemBackend
	entered chan struct{}
	release chan struct{}
}

func (b *stalledReads) ReadAt(p []byte, off int64) (int, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.release
	return b.MemBackend.ReadAt(p, off)
}

// TestClientRawClose: Close wakes a caller asleep waiting for its reply on
// the raw socket (it fails with ErrClosed), and no descriptor is left open
// (the raw socket's is released once nothing uses it).
func TestClientRawClose(t *testing.T) {
	be := stalledReads{MemBackend: NewMemBackend(1 << 20), entered: make(chan struct{}, 1), release: make(chan struct{})}
	released := false
	defer func() {
		if !released {
			close(be.release)
		}
	}()
	_, addr := startServer(t, Export{Name: testName, Backend: &be})
	before := openFDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := Dial(ctx, "tcp", addr, testName)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.ReadAt(make([]byte, 4096), 0)
		errc <- err
	}()
	select {
	case <-be.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the read did not reach the server")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("read on a closed client: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the caller waiting for its reply")
	}
	// Once the server's read returns, its side of the connection closes
	// too: then every descriptor Dial opened, and the server's, is closed.
	close(be.release)
	released = true
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open after Close, %d before Dial", openFDs(t), before)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestClientPollOnlyAlone: a caller alone in flight on its connection waits
// in poll(2) only while its call is the only one of the process's Clients,
// or, for a flush, while no Client has several calls in flight (a composed
// volume's flush goes to every part at once). Beside the calls of another
// Client at depth (the parts of a composed `rialto attach` under fio at
// QD32) it keeps to the netpoller: the sleeping caller would hold a P that
// their replies' readers need. Once those are over, a lone caller polls
// again. Both Clients reach nbdkit processes, so the process serves no
// connection itself.
func TestClientPollOnlyAlone(t *testing.T) {
	if _, err := exec.LookPath("nbdkit"); err != nil {
		t.Skip("nbdkit not installed")
	}
	waitTransmitting(t, 0)
	part := dialNbdkit(t, "memory", "1M")
	slow := dialNbdkit(t, "--filter=delay", "memory", "1M", "rdelay=60")
	buf := make([]byte, 4096)
	polls := func(flush bool) int64 {
		t.Helper()
		w := clientRawWaits.Load()
		for i := range 20 {
			var err error
			if flush {
				err = part.Flush()
			} else {
				_, err = part.ReadAt(buf, int64(i)*4096)
			}
			if err != nil {
				t.Fatalf("request %d (flush %v): %v", i, flush, err)
			}
		}
		return clientRawWaits.Load() - w
	}
	if polls(false) == 0 || polls(true) == 0 {
		t.Fatal("a lone caller never waited in poll(2)")
	}

	done := make(chan error, 2)
	slowRead := func() {
		go func() {
			_, err := slow.ReadAt(make([]byte, 512), 0)
			done <- err
		}()
	}
	// inFlight waits until n slow calls are in flight and their callers
	// have left the poll slot (a lone caller polls for clientPollMillis,
	// then waits in the netpoller).
	inFlight := func(n int32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for clientCalls.Load() != n || clientPolls.Load() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d calls in flight, %d callers polling; want %d and 0", clientCalls.Load(), clientPolls.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	slowRead()
	inFlight(1)
	if n := polls(false); n != 0 {
		t.Fatalf("%d reads waited in poll(2) beside another Client's call", n)
	}
	if polls(true) == 0 {
		t.Fatal("no flush waited in poll(2) beside one call on another Client")
	}
	slowRead()
	inFlight(2)
	if n := polls(true); n != 0 {
		t.Fatalf("%d flushes waited in poll(2) while another Client had two calls in flight", n)
	}
	// Close ends the slow reads (nbdkit holds them for a minute).
	slow.Close()
	for range 2 {
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Fatalf("slow read after Close: %v, want ErrClosed", err)
		}
	}
	if deepClients.Load() != 0 {
		t.Fatalf("%d Clients counted with several calls in flight after Close", deepClients.Load())
	}
	if polls(false) == 0 {
		t.Fatal("a lone caller did not wait in poll(2) once the other calls were over")
	}
}
