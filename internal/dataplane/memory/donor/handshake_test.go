package donor_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

// threads is the number of the process's threads.
func threads(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads in /proc/self/status")
	return 0
}

// stallConn passes a TLS client's handshake through until the client
// has read the server's flight and writes its own Finished, which it
// withholds: the server then waits for it.
type stallConn struct {
	net.Conn
	writes  int
	reached func()
	hold    chan struct{}
}

func (c *stallConn) Write(b []byte) (int, error) {
	c.writes++
	if c.writes == 1 {
		return c.Conn.Write(b) // the ClientHello
	}
	c.reached()
	<-c.hold
	return 0, net.ErrClosed
}

// TestHandshakesHoldNoThreads: connections that have not presented a
// credential (a TLS handshake or a HELLO still to come) cost the donor no
// thread each. Their handshakes ran on raw descriptors, each in poll(2)
// on a thread of its own for up to the handshake limit: anyone who could
// reach the donor held a thread per connection, and past the Go runtime's
// 10000 threads the process died, with every tenant's region.
func TestHandshakesHoldNoThreads(t *testing.T) {
	ca := memorytest.NewCA(t)
	td := memorytest.StartTLS(t, memorytest.ServerTLS(t, ca), 1<<20, 0)
	ccfg := memorytest.ClientTLS(t, ca)
	// Warm up: the threads a served session needs exist before counting.
	c := dial(t, td.Addr, client.Options{TLS: ccfg})
	if err := c.Read(context.Background(), client.ChannelSync, make([]byte, 64), 0); err != nil {
		t.Fatal(err)
	}
	before := threads(t)

	const stalled = 64
	hold := make(chan struct{})
	var wg, reached sync.WaitGroup
	conns := make([]net.Conn, 0, stalled)
	defer func() {
		close(hold)
		for _, nc := range conns {
			nc.Close()
		}
		wg.Wait()
	}()
	reached.Add(stalled)
	for range stalled {
		nc, err := net.Dial("tcp", td.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
		var once sync.Once
		sc := &stallConn{Conn: nc, hold: hold, reached: func() { once.Do(reached.Done) }}
		failed := func(err error) {
			once.Do(func() {
				t.Errorf("handshake ended before the client's Finished: %v", err)
				reached.Done()
			})
		}
		cfg := ccfg.Clone()
		cfg.MinVersion = tls.VersionTLS13
		cfg.ServerName = "127.0.0.1"
		wg.Add(1)
		go func() {
			defer wg.Done()
			failed(tls.Client(sc, cfg).HandshakeContext(context.Background()))
		}()
	}
	reached.Wait()
	// Every donor handler has sent its flight and waits for the
	// client's Finished. A round trip on the served session lets those
	// handlers reach their wait.
	for range 3 {
		if err := c.Read(context.Background(), client.ChannelSync, make([]byte, 64), 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := threads(t); got-before >= stalled/2 {
		t.Fatalf("%d stalled handshakes took %d threads (%d -> %d)", stalled, got-before, before, got)
	}
}
