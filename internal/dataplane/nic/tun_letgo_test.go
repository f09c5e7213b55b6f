package nic

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/internal/sharertest"
)

// TestTUNLetGoWhileAChildSharesIt: a TUN interface closeTUN closed is
// gone, and opened again at once, though a child process (cat, given a
// copy of the descriptor, as a child that any goroutine forks has one
// until its exec) still shares it. Closing the descriptor alone left the
// interface, its address and routes with the child, and opening it again
// (a lease served again by the next agent of the process) failed with
// EBUSY.
func TestTUNLetGoWhileAChildSharesIt(t *testing.T) {
	// A network namespace of the test's own thread, which the thread
	// ends with (never unlocked): the interface is nobody else's.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Skipf("no network namespace of the test's own: %v", err)
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip(err)
	}
	const name = "rt-letgo0"
	f, err := openTUN(name)
	if err != nil {
		t.Fatal(err)
	}
	sharertest.Share(t, f)
	if err := closeTUN(f, name); err != nil {
		t.Fatal(err)
	}
	if l, err := netlink.LinkByName(name); err == nil {
		t.Errorf("interface %s (index %d) still there once closed", name, l.Attrs().Index)
	}
	g, err := openTUN(name)
	if err != nil {
		t.Fatalf("the interface opened again, a child sharing the last one: %v", err)
	}
	if err := closeTUN(g, name); err != nil {
		t.Fatal(err)
	}
}
