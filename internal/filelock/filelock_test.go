package filelock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/sharertest"
)

func TestOpenExcludesAndNamesTheHolder(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	// A second open file description excludes like another process.
	_, err = Open(p)
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrLocked) || held.PID != os.Getpid() || held.Shared {
		t.Fatalf("a second lock: %v (%+v); want a HeldError naming pid %d", err, held, os.Getpid())
	}
	if want := p + " is locked by another process (pid "; len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
		t.Errorf("message %q, want it to start with %q", err, want)
	}
	// Wait gives up when told to, or when ctx ends.
	if _, err := Wait(context.Background(), p, time.Millisecond, func() bool { return false }); !errors.Is(err, ErrLocked) {
		t.Errorf("Wait told not to wait: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	if _, err := Wait(ctx, p, time.Millisecond, func() bool { calls++; cancel(); return true }); !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("Wait with ctx cancelled: %v after %d calls", err, calls)
	}
	// Released by Close: Wait gets it once the holder lets go.
	got, err := Wait(context.Background(), p, time.Millisecond, func() bool { f.Close(); return true })
	if err != nil {
		t.Fatalf("Wait after the holder closed: %v", err)
	}
	got.Close()
}

func TestHolderOfAnUnlockedFile(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "free"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if pid, shared := Holder(f); pid != 0 || shared {
		t.Errorf("Holder of an unlocked file: %d, %v", pid, shared)
	}
}

// TestCloseLetsGoWhileAChildSharesIt: a lock Close let go is another's at
// once, though a child process (cat, given a copy of the descriptor, as a
// child forked by any goroutine has one until its exec) still shares its
// open file description. Closing the file alone left the lock with the
// child: the next Open of the process was refused as if another held it.
func TestCloseLetsGoWhileAChildSharesIt(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	sharertest.Share(t, f)
	if err := Close(f); err != nil {
		t.Fatal(err)
	}
	g, err := Open(p)
	if err != nil {
		t.Fatalf("the lock Close let go, a child sharing it: %v", err)
	}
	if err := Close(g); err != nil {
		t.Fatal(err)
	}
	if err := Close(nil); err != nil {
		t.Errorf("Close(nil): %v", err)
	}
}
