package nbd

import (
	"testing"
	"time"
)

// waitTransmitting polls until n connections of this process are in the
// transmission phase.
func waitTransmitting(t *testing.T, n int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for transmitting.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections transmitting, want %d", transmitting.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPollOnlyWhenAlone: a connection's reader waits for the next request
// in poll(2) while it is the process's only transmitting connection, and in
// the netpoller as soon as there is another (whose reader would otherwise
// hold the other P in a system call too).
func TestPollOnlyWhenAlone(t *testing.T) {
	waitTransmitting(t, 0)
	_, addr := startServer(t, Export{Name: "x", Backend: NewMemBackend(1 << 20)})
	buf := make([]byte, 4096)
	reads := func(c *Client) {
		t.Helper()
		for i := range 20 {
			if _, err := c.ReadAt(buf, int64(i)*4096); err != nil {
				t.Fatal(err)
			}
		}
	}
	c1 := dial(t, addr, "x")
	waitTransmitting(t, 1)
	p0 := polls.Load()
	reads(c1)
	if polls.Load() == p0 {
		t.Fatal("the only connection never waited in poll(2)")
	}

	c2 := dial(t, addr, "x")
	waitTransmitting(t, 2)
	p1 := polls.Load()
	reads(c1)
	reads(c2)
	if got := polls.Load() - p1; got != 0 {
		t.Fatalf("%d waits in poll(2) with two connections", got)
	}

	c2.Close()
	waitTransmitting(t, 1)
	p2 := polls.Load()
	reads(c1)
	if polls.Load() == p2 {
		t.Fatal("alone again, the connection never waited in poll(2)")
	}
}
