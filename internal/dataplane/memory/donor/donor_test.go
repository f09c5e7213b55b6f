package donor_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

const testCred = memorytest.Credential

func dial(t testing.TB, addr string, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), addr, testCred, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var channels = []client.Channel{client.ChannelSync, client.ChannelBulk, client.ChannelQueue, client.ChannelAdaptive}

func TestRemoveRegionEndsSession(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 0)
	c := dial(t, td.Addr, client.Options{Timeout: 2 * time.Second})
	if err := c.Write(context.Background(), client.ChannelSync, bytes.Repeat([]byte{7}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := td.D.RemoveRegion(testCred); err != nil {
		t.Fatal(err)
	}
	for _, ch := range channels {
		if err := c.Read(context.Background(), ch, make([]byte, 64), 0); err == nil {
			t.Fatalf("%v read after removal succeeded", ch)
		}
	}
	if _, err := client.Dial(context.Background(), td.Addr, testCred, client.Options{}); !errors.Is(err, protocol.ErrAuth) {
		t.Fatalf("dial after removal: %v", err)
	}
	// Re-adding gives a zeroed region.
	if err := td.D.AddRegion(testCred, 1<<20); err != nil {
		t.Fatal(err)
	}
	c2 := dial(t, td.Addr, client.Options{})
	b := make([]byte, 4096)
	if err := c2.Read(context.Background(), client.ChannelSync, b, 0); err != nil || !bytes.Equal(b, make([]byte, 4096)) {
		t.Fatalf("re-added region not zero: %v", err)
	}
	if err := td.D.AddRegion(testCred, 1); !errors.Is(err, donor.ErrRegionExists) {
		t.Fatalf("duplicate AddRegion: %v", err)
	}
	if err := td.D.RemoveRegion("nope"); !errors.Is(err, donor.ErrNoRegion) {
		t.Fatalf("RemoveRegion unknown: %v", err)
	}
	if err := td.D.AddRegion("huge", 1<<50); !errors.Is(err, donor.ErrInsufficient) {
		t.Fatalf("AddRegion huge: %v", err)
	}
}

// TestRawDescriptorsOffNetpoller: the sockets the donor serves sync and
// bulk connections on with raw syscalls are registered with no epoll
// instance of the process (docs/memory-protocol.md) while they are in
// use (an idle one waits on the netpoller, registered under another
// descriptor, until its next request: TestIdleConnectionLeavesNetpoller).
// The client's end is checked by the client's test of the same name.
func TestRawDescriptorsOffNetpoller(t *testing.T) {
	td := memorytest.StartWith(t, 1<<20, 0, func(d *donor.Donor) { d.IdleWait = time.Hour })
	c := dial(t, td.Addr, client.Options{})
	if err := c.Read(context.Background(), client.ChannelBulk, make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	// The donor detaches each connection when its serving thread starts,
	// which may follow the client's first request: wait for all of them
	// (the sync connection and the default two bulk streams).
	const want = 3
	var fds []int
	for deadline := time.Now().Add(10 * time.Second); ; {
		fds = td.D.RawFds()
		if len(fds) >= want || time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
	}
	if len(fds) != want {
		t.Fatalf("%d raw descriptors at the donor, want %d (sync and each bulk stream)", len(fds), want)
	}
	named := map[int]string{}
	for _, fd := range fds {
		named[fd] = "donor sync or bulk connection"
	}
	memorytest.CheckOffNetpoller(t, named)
}

// TestTLSOffNetpoller: a donor that requires TLS detaches every connection
// once its HELLO is answered (the handshake and the HELLO run on the
// netpoller: TestHandshakesHoldNoThreads), so that the TLS records of
// each (control, sync, bulk, queue) travel on raw syscalls off the
// netpoller as plaintext sync and bulk connections do (while in use, as
// there).
func TestTLSOffNetpoller(t *testing.T) {
	ca := memorytest.NewCA(t)
	td := memorytest.StartTLSWith(t, memorytest.ServerTLS(t, ca), 1<<20, 0, func(d *donor.Donor) { d.IdleWait = time.Hour })
	c := dial(t, td.Addr, client.Options{TLS: memorytest.ClientTLS(t, ca)})
	ctx := context.Background()
	buf := make([]byte, 1<<20)
	for _, ch := range []client.Channel{client.ChannelSync, client.ChannelBulk, client.ChannelQueue} {
		if err := c.Read(ctx, ch, buf[:64<<10], 0); err != nil {
			t.Fatalf("%v: %v", ch, err)
		}
	}
	const want = 5 // control, sync, two bulk streams, the queue pair
	var fds []int
	for deadline := time.Now().Add(10 * time.Second); ; {
		fds = td.D.RawFds()
		if len(fds) >= want || time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
	}
	if len(fds) != want {
		t.Fatalf("%d raw descriptors at the donor, want %d", len(fds), want)
	}
	named := map[int]string{}
	for _, fd := range fds {
		named[fd] = "donor TLS connection"
	}
	memorytest.CheckOffNetpoller(t, named)
}
