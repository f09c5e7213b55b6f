package nbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
)

// TestSuspendKeepsMove: an export suspended while a move tracks and then
// holds its writes (the agent suspends a lease whose known expiry passed
// during a sealed move) and resumed before the move ends (the lease
// renewed) is still moving: its writes are marked, and held while the
// move holds them, so none lands unseen by the copy the move's commit
// serves. While suspended it is no export a client can open, and the
// write held at the suspension ends with its connection.
func TestSuspendKeepsMove(t *testing.T) {
	const size = 1 << 20
	be := NewMemBackend(size)
	s, addr := startServer(t, Export{Name: "x", Backend: be})
	ctx := context.Background()
	before := bytes.Repeat([]byte{1}, 4096)
	c := dial(t, addr, "x")
	if _, err := c.WriteAt(before, 0); err != nil {
		t.Fatal(err)
	}
	d := dirty.New(size, 4096)
	if err := s.TrackWrites(ctx, "x", d); err != nil {
		t.Fatal(err)
	}
	if err := s.SuspendExport("nope"); !errors.Is(err, ErrExportNotFound) {
		t.Errorf("SuspendExport of an unknown export: %v", err)
	}

	// Suspended and resumed while the copy runs: still marked.
	if err := s.SuspendExport("x"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadAt(make([]byte, 4096), 0); err == nil {
		t.Error("a connection of the suspended export still reads")
	}
	if c2, err := Dial(ctx, "tcp", addr, "x"); err == nil {
		c2.Close()
		t.Error("a client opened the suspended export")
	}
	if err := s.SuspendExport("x"); err != nil {
		t.Errorf("suspending it again: %v", err)
	}
	if err := s.ResumeExport("x"); err != nil {
		t.Fatal(err)
	}
	c = dial(t, addr, "x")
	if _, err := c.WriteAt(bytes.Repeat([]byte{2}, 4096), 8192); err != nil {
		t.Fatal(err)
	}
	if got, want := d.Take(), []dirty.Range{{Off: 8192, Len: 4096}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the export was resumed the move's map holds %v, want %v", got, want)
	}

	// heldOrDone waits until a write is held or has been answered.
	heldOrDone := func(done chan error) (error, bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			select {
			case err := <-done:
				return err, true
			default:
			}
			if s.HeldWrites("x") == 1 {
				return nil, false
			}
			if time.Now().After(deadline) {
				t.Fatal("the write was neither held nor answered")
			}
			runtime.Gosched()
		}
	}
	// Suspended and resumed while the move holds the writes (sealed).
	if err := s.PauseWrites(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() {
		_, err := c.WriteAt(bytes.Repeat([]byte{3}, 4096), 0)
		held <- err
	}()
	if err, done := heldOrDone(held); done {
		t.Fatalf("a write went through a paused move: %v", err)
	}
	if err := s.SuspendExport("x"); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err == nil {
		t.Error("the write held at the suspension was applied")
	}
	if err := s.ResumeExport("x"); err != nil {
		t.Fatal(err)
	}
	c3 := dial(t, addr, "x")
	late := make(chan error, 1)
	go func() {
		_, err := c3.WriteAt(bytes.Repeat([]byte{4}, 4096), 0)
		late <- err
	}()
	if err, done := heldOrDone(late); done {
		t.Fatalf("after the export was resumed, a write went through the move that holds them (err %v, dirty %v)", err, d.Take())
	}
	if err := s.Retire(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := <-late; !errors.Is(err, ErrShutdown) {
		t.Errorf("the write held at the retirement: %v, want ESHUTDOWN", err)
	}
	got := make([]byte, 4096)
	if _, err := be.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, before) {
		t.Errorf("the export holds %d..., want the bytes from before the move held its writes", got[0])
	}
	if err := s.ResumeExport("x"); !errors.Is(err, ErrExportNotFound) {
		t.Errorf("ResumeExport of a retired export: %v", err)
	}
}

// TestSuspendedExportRemoved: RemoveExport removes a suspended export, and
// a move given up while it was suspended (EndMove) leaves it served
// without a move once resumed.
func TestSuspendedExportRemoved(t *testing.T) {
	be := NewMemBackend(1 << 20)
	s, addr := startServer(t, Export{Name: "x", Backend: be}, Export{Name: "y", Backend: NewMemBackend(1 << 20)})
	ctx := context.Background()
	if err := s.PauseWrites(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := s.SuspendExport("x"); err != nil {
		t.Fatal(err)
	}
	if err := s.EndMove("x"); err != nil {
		t.Fatal(err)
	}
	if err := s.ResumeExport("x"); err != nil {
		t.Fatal(err)
	}
	c := dial(t, addr, "x")
	if _, err := c.WriteAt(bytes.Repeat([]byte{5}, 4096), 0); err != nil {
		t.Fatalf("a write after the move ended: %v", err)
	}
	if err := s.SuspendExport("y"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveExport("y"); err != nil {
		t.Fatal(err)
	}
	if err := s.ResumeExport("y"); !errors.Is(err, ErrExportNotFound) {
		t.Errorf("ResumeExport of a removed export: %v", err)
	}
	if err := s.AddExport(Export{Name: "y", Backend: NewMemBackend(4096)}); err != nil {
		t.Errorf("the name of a removed suspended export is not free: %v", err)
	}
}

// TestAddSuspendedExport: an export added suspended is known (a second
// add of its name is refused) but no client opens it until ResumeExport
// serves it, with what its backend holds.
func TestAddSuspendedExport(t *testing.T) {
	be := NewMemBackend(1 << 20)
	if _, err := be.WriteAt(bytes.Repeat([]byte{7}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	s, addr := startServer(t)
	if err := s.AddSuspendedExport(Export{Name: "x", Backend: be}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if c, err := Dial(ctx, "tcp", addr, "x"); err == nil {
		c.Close()
		t.Fatal("a client opened an export added suspended")
	}
	if err := s.AddExport(Export{Name: "x", Backend: be}); !errors.Is(err, ErrExportExists) {
		t.Errorf("adding the name again: %v, want ErrExportExists", err)
	}
	if err := s.ResumeExport("x"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if _, err := dial(t, addr, "x").ReadAt(got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{7}, 4096)) {
		t.Fatalf("once resumed: %v, %x...", err, got[:4])
	}
}
