package nbd

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// serverSock returns the raw socket under export name's only connection
// (plaintext, or under TLS) once it has one.
func serverSock(t *testing.T, s *Server, name string) *rawSock {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		var rs *rawSock
		for c := range s.exports[name].conns {
			nc := c.nc
			if tc, ok := nc.(*tlsConn); ok {
				nc = tc.raw
			}
			rs, _ = nc.(*rawSock)
		}
		s.mu.Unlock()
		if rs != nil {
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection on a raw socket")
		}
		time.Sleep(time.Millisecond)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestRawSocketModes: a plaintext connection's socket leaves Go's netpoller
// while requests come one at a time (its reader waits in poll(2)), goes
// back to it when the connection idles (no thread held), and leaves it
// again when requests resume; bytes written and read stay right across
// the changes, and the descriptors are closed when the connection ends.
func TestRawSocketModes(t *testing.T) {
	waitTransmitting(t, 0)
	path := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	be, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	s, addr := startServer(t, Export{Name: "x", Backend: be})
	fds0 := openFDs(t)
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("x", false, false)
	waitTransmitting(t, 1)
	rs := serverSock(t, s, "x")

	h := uint64(0)
	for round := range 3 {
		// Idle: after its short poll the reader waits in the netpoller.
		waitFor(t, "the idle connection waits in the netpoller", rs.polled)
		d0 := rs.drops.Load()
		rc.writeFlushRead(t, &h, byte(round*64), 50)
		if rs.drops.Load() == d0 {
			t.Fatalf("round %d: requests one at a time, and the socket never left the netpoller", round)
		}
	}

	rc.c.Close()
	waitTransmitting(t, 0)
	waitFor(t, "the connection's descriptors are closed", func() bool { return openFDs(t) <= fds0 })
}

// TestRawSocketStaysPolledAtDepth: with requests arriving several at a
// time the reader waits in the netpoller, which then keeps the socket
// (no registration per wait).
func TestRawSocketStaysPolledAtDepth(t *testing.T) {
	waitTransmitting(t, 0)
	s, addr := startServer(t, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
	rc.goTransmission("x", false, false)
	waitTransmitting(t, 1)
	rs := serverSock(t, s, "x")
	waitFor(t, "the idle connection waits in the netpoller", rs.polled)
	d0 := rs.drops.Load()
	for round := range 20 {
		for i := range 16 {
			rc.request(Request{Type: CmdRead, Handle: uint64(round*16 + i), Offset: uint64(i) * 4096, Length: 4096}, nil)
		}
		for i := range 16 {
			if r, err := rc.reply(4096); err != nil || r.errno != 0 {
				t.Fatalf("read %d: %v (errno %d)", i, err, r.errno)
			}
		}
	}
	// The first wait of a burst may still look like queue depth 1; the
	// rest must not, so the socket left the netpoller at most once per burst.
	if got := rs.drops.Load() - d0; got > 20 {
		t.Fatalf("the socket left the netpoller %d times in 20 bursts of 16 requests", got)
	}
}

// TestRemoveExportEndsRawConnections: RemoveExport ends a plaintext
// connection whatever its reader is doing (waiting in the netpoller while
// idle, in poll(2) or serving while requests flow), and the client sees
// the connection close.
func TestRemoveExportEndsRawConnections(t *testing.T) {
	for _, busy := range []bool{false, true} {
		waitTransmitting(t, 0)
		s, addr := startServer(t, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
		rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
		rc.goTransmission("x", false, false)
		waitTransmitting(t, 1)
		rs := serverSock(t, s, "x")
		var wg sync.WaitGroup
		if busy {
			// Reads one at a time until the connection ends.
			started := make(chan struct{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					if i == 10 {
						close(started)
					}
					var b [requestHeaderLen]byte
					putRequest(b[:], Request{Type: CmdRead, Handle: uint64(i), Length: 4096})
					_, err := rc.c.Write(b[:])
					if err == nil {
						_, err = rc.reply(4096)
					}
					if err != nil {
						if i < 10 {
							close(started)
						}
						return
					}
				}
			}()
			<-started
		} else {
			waitFor(t, "the idle connection waits in the netpoller", rs.polled)
		}
		done := make(chan error, 1)
		go func() { done <- s.RemoveExport("x") }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("busy=%v: RemoveExport did not return", busy)
		}
		wg.Wait()
		if !busy && !rc.closed() {
			t.Fatal("the client's connection stayed open after RemoveExport")
		}
		rc.c.Close()
	}
}

// TestRawSocketPolledReads: with two connections in transmission neither
// reader polls, and once a socket is registered with the netpoller its
// reader reads and parks there directly (readPolled, no ppoll first).
// Requests sent one at a time, each after its reader has parked, must all
// be answered: a wakeup missed between the read and the park would hang.
func TestRawSocketPolledReads(t *testing.T) {
	waitTransmitting(t, 0)
	_, addr := startServer(t, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	var rcs [2]*rawConn
	for i := range rcs {
		rcs[i] = rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
		rcs[i].goTransmission("x", false, false)
	}
	waitTransmitting(t, 2)
	d0 := directWaits.Load()
	buf := make([]byte, 4096)
	for round := range 200 {
		rc := rcs[round%2]
		buf[0] = byte(round)
		rc.request(Request{Type: CmdWrite, Handle: uint64(round), Offset: uint64(round%8) * 4096, Length: 4096}, buf)
		if r, err := rc.reply(0); err != nil || r.errno != 0 {
			t.Fatalf("write %d: %v (errno %d)", round, err, r.errno)
		}
		rc.request(Request{Type: CmdFlush, Handle: uint64(round)}, nil)
		if r, err := rc.reply(0); err != nil || r.errno != 0 {
			t.Fatalf("flush %d: %v (errno %d)", round, err, r.errno)
		}
	}
	if directWaits.Load() == d0 {
		t.Fatal("no reader read on its registered socket directly")
	}
}
