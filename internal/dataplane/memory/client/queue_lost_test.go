package client

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// gatedRelay relays one connection to a donor: the client's bytes go
// through at once; of the donor's, the HELLO reply goes through, then
// nothing until release, which lets exactly one more frame through.
// After that the client's side stays open and silent: to the client,
// the connection is dead (no answer, no end).
type gatedRelay struct {
	ln      net.Listener
	release chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func startGatedRelay(t *testing.T, donor string) *gatedRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &gatedRelay{ln: ln, release: make(chan struct{})}
	r.wg.Go(func() {
		cc, err := ln.Accept()
		if err != nil {
			return
		}
		dc, err := net.Dial("tcp", donor)
		if err != nil {
			cc.Close()
			return
		}
		r.mu.Lock()
		r.conns = append(r.conns, cc, dc)
		r.mu.Unlock()
		r.wg.Go(func() {
			var b [64 << 10]byte
			for {
				n, err := cc.Read(b[:])
				if n > 0 {
					if _, err := dc.Write(b[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
		forward := func() bool {
			var hdr [protocol.HeaderSize]byte
			f, err := protocol.ReadFrame(dc, hdr[:], nil)
			if err != nil {
				return false
			}
			_, err = cc.Write(append(hdr[:], f.Data...))
			return err == nil
		}
		if !forward() { // the HELLO reply
			return
		}
		<-r.release
		forward()
	})
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		select {
		case <-r.release:
		default:
			close(r.release)
		}
		r.wg.Wait()
	})
	return r
}

// TestQueueReadsAnswersAfterSessionLost: when a session's control
// connection ends (its region was retired: the donor answered the held
// writes GONE on their queue connection, then closed every connection),
// a queue pair still reads the answers its connection holds, which may
// arrive after the control connection's end: the first held write is
// reported GONE, not lost. A request whose answer never comes (here the
// connection goes silent, neither answering nor ending) still fails, at
// its deadline, as lost: the pair does not wait for a dead connection.
func TestQueueReadsAnswersAfterSessionLost(t *testing.T) {
	const size = 1 << 20
	const timeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	td := memorytest.Start(t, size, 0)
	relay := startGatedRelay(t, td.Addr)
	var viaRelay atomic.Bool
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		if viaRelay.Load() {
			addr = relay.ln.Addr().String()
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	c, err := Dial(ctx, td.Addr, testCred, Options{Timeout: timeout, Dialer: dialer})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	viaRelay.Store(true)
	q, err := c.NewQueuePair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	viaRelay.Store(false)

	if err := td.D.PauseWrites(ctx, testCred); err != nil {
		t.Fatal(err)
	}
	p := bytes.Repeat([]byte{7}, 4096)
	first, err := q.Post(ctx, Op{Write: true, Off: 0, Buf: p, Tag: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Post(ctx, Op{Write: true, Off: 4096, Buf: p, Tag: 2}); err != nil {
		t.Fatal(err)
	}
	for td.D.Waiting(testCred) != 1 { // the first write is held
		select {
		case <-ctx.Done():
			t.Fatal("the write was not held")
		case <-time.After(time.Millisecond):
		}
	}
	// The region moves away: the held write is answered GONE on the queue
	// connection (the relay keeps the answer), every connection closes.
	if err := td.D.RetireRegion(ctx, testCred); err != nil {
		t.Fatal(err)
	}
	<-c.ctrlDone // the client saw its control connection end
	if err := c.err(); !errors.Is(err, protocol.ErrDonorLost) {
		t.Fatalf("session after its control connection ended: %v", err)
	}
	close(relay.release) // the first answer arrives, then nothing
	start := time.Now()
	got := map[uint64]error{}
	for len(got) < 2 {
		select {
		case cp := <-q.Completions():
			got[cp.Tag] = cp.Err
		case <-ctx.Done():
			t.Fatalf("the queue pair's requests did not complete: %v", got)
		}
	}
	if err := got[1]; !errors.Is(err, protocol.ErrGone) {
		t.Errorf("the held write (seq %d) answered GONE after the session's end: %v, want ErrGone", first, err)
	}
	if err := got[2]; !errors.Is(err, protocol.ErrDonorLost) {
		t.Errorf("the write never answered: %v, want ErrDonorLost", err)
	}
	if d := time.Since(start); d > 10*timeout {
		t.Errorf("the unanswered write failed after %v (request timeout %v)", d, timeout)
	}
	if _, err := q.Post(ctx, Op{Off: 0, Buf: p}); !errors.Is(err, protocol.ErrDonorLost) {
		t.Errorf("a post on the lost session: %v", err)
	}
	_ = q.Close()
}
