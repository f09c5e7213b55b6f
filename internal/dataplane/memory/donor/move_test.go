package donor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMoveRegion: the donor side of a memory lease moving while it is
// written, over every channel: writes are marked in the dirty map once
// they are in the region, held while paused (reads go on), refused with
// StatusGone once the region is retired, whose session then ends.
func TestMoveRegion(t *testing.T) {
	const size = 1 << 20
	for _, ch := range []client.Channel{client.ChannelSync, client.ChannelBulk, client.ChannelQueue} {
		t.Run(ch.String(), func(t *testing.T) {
			td := memorytest.Start(t, size, 0)
			c := dial(t, td.Addr, client.Options{Timeout: 10 * time.Second})
			ctx := context.Background()
			if n, err := td.D.RegionSize(testCred); err != nil || n != size {
				t.Fatalf("RegionSize = %d, %v", n, err)
			}
			if err := c.Write(ctx, ch, bytes.Repeat([]byte{1}, 4096), 0); err != nil {
				t.Fatal(err)
			}
			m := dirty.New(size, 4096)
			if err := td.D.TrackWrites(ctx, testCred, dirty.New(size/2, 4096)); err == nil {
				t.Error("a dirty map of the wrong size was accepted")
			}
			if err := td.D.TrackWrites(ctx, testCred, m); err != nil {
				t.Fatal(err)
			}
			if err := c.Write(ctx, ch, bytes.Repeat([]byte{2}, 8192), 3*4096); err != nil {
				t.Fatal(err)
			}
			if err := c.Read(ctx, ch, make([]byte, 4096), 0); err != nil {
				t.Fatal(err)
			}
			if got := m.Take(); fmt.Sprint(got) != fmt.Sprint([]dirty.Range{{Off: 3 * 4096, Len: 8192}}) {
				t.Errorf("dirty = %v", got)
			}
			got := make([]byte, 8192)
			if _, err := td.D.ReadRegion(testCred, got, 3*4096); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{2}, 8192)) {
				t.Errorf("ReadRegion: %v", err)
			}

			if err := td.D.PauseWrites(ctx, testCred); err != nil {
				t.Fatal(err)
			}
			w := make(chan error, 1)
			go func() { w <- c.Write(ctx, ch, bytes.Repeat([]byte{3}, 4096), 8*4096) }()
			waitFor(t, "the write to be held", func() bool { return td.D.Waiting(testCred) == 1 })
			// A read on another connection than the held write's.
			other := client.ChannelSync
			if ch == client.ChannelSync {
				other = client.ChannelBulk
			}
			if err := c.Read(ctx, other, make([]byte, 4096), 0); err != nil {
				t.Errorf("read while writes are held: %v", err)
			}
			if _, err := td.D.ReadRegion(testCred, got[:4096], 8*4096); err != nil || !bytes.Equal(got[:4096], make([]byte, 4096)) {
				t.Error("a held write reached the region")
			}
			if err := td.D.ResumeWrites(testCred); err != nil {
				t.Fatal(err)
			}
			if err := <-w; err != nil {
				t.Fatal(err)
			}
			if got := m.Take(); fmt.Sprint(got) != fmt.Sprint([]dirty.Range{{Off: 8 * 4096, Len: 4096}}) {
				t.Errorf("dirty after the resumed write = %v", got)
			}

			// Retired with a write held: it is refused, the session ends.
			if err := td.D.PauseWrites(ctx, testCred); err != nil {
				t.Fatal(err)
			}
			go func() { w <- c.Write(ctx, ch, bytes.Repeat([]byte{4}, 4096), 9*4096) }()
			waitFor(t, "the second write to be held", func() bool { return td.D.Waiting(testCred) == 1 })
			if err := td.D.RetireRegion(ctx, testCred); err != nil {
				t.Fatal(err)
			}
			// The donor answers GONE before it closes the session's
			// connections (RetireRegion drains the refusals), and the
			// client reads it on every channel: a queue pair whose
			// session's control connection ends first still reads what
			// its own connection holds before it fails what is left.
			if err := <-w; !errors.Is(err, protocol.ErrGone) {
				t.Errorf("held write at the retire: %v, want ErrGone", err)
			}
			if _, err := td.D.ReadRegion(testCred, got[:4096], 9*4096); err != nil || !bytes.Equal(got[:4096], make([]byte, 4096)) {
				t.Error("the refused write reached the region")
			}
			if _, err := client.Dial(ctx, td.Addr, testCred, client.Options{}); err == nil {
				t.Error("a retired region admitted a new session")
			}
			if err := td.D.RemoveRegion(testCred); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestActivateRegion: a region received under a transfer's credential
// is served under the lease's once activated, with its contents.
func TestActivateRegion(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 0)
	c, err := client.Dial(context.Background(), td.Addr, testCred, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(context.Background(), client.ChannelBulk, bytes.Repeat([]byte("moved"), 1000), 0); err != nil {
		t.Fatal(err)
	}
	if err := td.D.ActivateRegion(testCred, "lease-cred"); err != nil {
		t.Fatal(err)
	}
	if err := c.Read(context.Background(), client.ChannelSync, make([]byte, 10), 0); err == nil {
		t.Error("the transfer's session survived the activation")
	}
	c.Close()
	if _, err := client.Dial(context.Background(), td.Addr, testCred, client.Options{}); !errors.Is(err, protocol.ErrAuth) {
		t.Errorf("the transfer's credential after the activation: %v", err)
	}
	c2, err := client.Dial(context.Background(), td.Addr, "lease-cred", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	got := make([]byte, 5000)
	if err := c2.Read(context.Background(), client.ChannelBulk, got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte("moved"), 1000)) {
		t.Errorf("contents after the activation: %v", err)
	}
	if err := td.D.ActivateRegion("nope", "x"); err == nil {
		t.Error("activated an unknown region")
	}
}

// TestSuspendKeepsMove: a region suspended while a move holds its writes
// (a sealed move, the lease's expiry passing at the source) and resumed
// (the lease renewed) before the move's commit still holds them: a write
// that landed here then would be missing at the destination, which the
// commit makes the lease's region. The write held at the suspension is
// refused with its session, and SuspendRegion does not wait for it.
func TestSuspendKeepsMove(t *testing.T) {
	const size = 1 << 20
	td := memorytest.Start(t, size, 0)
	ctx := context.Background()
	c := dial(t, td.Addr, client.Options{Timeout: 10 * time.Second})
	if err := c.Write(ctx, client.ChannelSync, bytes.Repeat([]byte{1}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	m := dirty.New(size, 4096)
	if err := td.D.TrackWrites(ctx, testCred, m); err != nil {
		t.Fatal(err)
	}
	if err := td.D.PauseWrites(ctx, testCred); err != nil {
		t.Fatal(err)
	}
	// heldOrDone waits until the write is held or has returned.
	heldOrDone := func(done chan error) (error, bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			select {
			case err := <-done:
				return err, true
			default:
			}
			if td.D.Waiting(testCred) == 1 {
				return nil, false
			}
			if time.Now().After(deadline) {
				t.Fatal("the write was neither held nor answered")
			}
			runtime.Gosched()
		}
	}
	held := make(chan error, 1)
	go func() { held <- c.Write(ctx, client.ChannelSync, bytes.Repeat([]byte{2}, 4096), 0) }()
	if err, done := heldOrDone(held); done {
		t.Fatalf("a write went through a paused move: %v", err)
	}
	if err := td.D.SuspendRegion(testCred); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err == nil {
		t.Error("the write held at the suspension was applied")
	}
	if err := td.D.ResumeRegion(testCred); err != nil {
		t.Fatal(err)
	}
	c2 := dial(t, td.Addr, client.Options{Timeout: 10 * time.Second})
	late := make(chan error, 1)
	go func() { late <- c2.Write(ctx, client.ChannelSync, bytes.Repeat([]byte{3}, 4096), 0) }()
	if err, done := heldOrDone(late); done {
		t.Fatalf("after the region was resumed, a write went through the move that holds them (err %v, dirty %v)", err, m.Take())
	}
	if err := td.D.RetireRegion(ctx, testCred); err != nil {
		t.Fatal(err)
	}
	if err := <-late; !errors.Is(err, protocol.ErrGone) {
		t.Errorf("the write held at the retirement: %v, want ErrGone", err)
	}
	got := make([]byte, 4096)
	if _, err := td.D.ReadRegion(testCred, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{1}, 4096)) {
		t.Errorf("the region holds %d..., want the bytes from before the move held its writes", got[0])
	}
}

// TestResumeRetiredRegion: a region that moved away (retired, not yet
// removed: the window in a move's commit) is not served again when its
// lease's renewal resumes it: ResumeRegion refuses, and a borrower's new
// session is refused too, instead of reading the region's stale contents.
func TestResumeRetiredRegion(t *testing.T) {
	const size = 1 << 20
	td := memorytest.Start(t, size, 0)
	ctx := context.Background()
	if err := td.D.TrackWrites(ctx, testCred, dirty.New(size, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := td.D.SuspendRegion(testCred); err != nil {
		t.Fatal(err)
	}
	if err := td.D.RetireRegion(ctx, testCred); err != nil {
		t.Fatal(err)
	}
	if err := td.D.ResumeRegion(testCred); !errors.Is(err, donor.ErrRetired) {
		t.Errorf("ResumeRegion of a retired region: %v, want ErrRetired", err)
	}
	if c, err := client.Dial(ctx, td.Addr, testCred, client.Options{}); err == nil {
		c.Close()
		t.Fatal("a retired region admitted a new session after ResumeRegion")
	}
	if err := td.D.RemoveRegion(testCred); err != nil {
		t.Fatal(err)
	}
	if err := td.D.ResumeRegion(testCred); !errors.Is(err, donor.ErrNoRegion) {
		t.Errorf("ResumeRegion of a removed region: %v, want ErrNoRegion", err)
	}
}

// TestActivateRegionCredentialBound: ActivateRegion refuses a credential
// longer than a HELLO carries (protocol.MaxCredential), as AddRegion
// does: no borrower could reach the region under it. The region stays
// served under its own credential.
func TestActivateRegionCredentialBound(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 0)
	long := strings.Repeat("c", protocol.MaxCredential+1)
	if err := td.D.ActivateRegion(testCred, long); err == nil {
		t.Fatalf("a %d-byte credential was accepted", len(long))
	}
	if err := td.D.ActivateRegion(testCred, ""); err == nil {
		t.Fatal("an empty credential was accepted")
	}
	c, err := client.Dial(context.Background(), td.Addr, testCred, client.Options{})
	if err != nil {
		t.Fatalf("the region after the refused activation: %v", err)
	}
	c.Close()
	if err := td.D.ActivateRegion(testCred, strings.Repeat("c", protocol.MaxCredential)); err != nil {
		t.Fatalf("a credential of %d bytes: %v", protocol.MaxCredential, err)
	}
}
