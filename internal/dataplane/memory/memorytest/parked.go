package memorytest

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// AwaitChildParked waits until the child donor pid (StartChild) has its
// end of the loopback connection fd (a socket of this process connected
// to it) registered with one of its epoll instances: the connection's
// wait for its next request has moved to the donor's netpoller, as an
// idle connection's does once idle for Donor.IdleWait.
func AwaitChildParked(t testing.TB, pid, fd int) {
	t.Helper()
	ino := peerInode(t, pid, fd)
	for deadline := time.Now().Add(10 * time.Second); !registered(pid, ino); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("the child donor's end of the connection (socket inode %d) was not registered with its netpoller within 10 s", ino)
		}
	}
}

// peerInode is the inode of the socket at the other end of the loopback
// TCP connection fd, as /proc/pid/net/tcp lists it.
func peerInode(t testing.TB, pid, fd int) uint64 {
	t.Helper()
	local, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		t.Fatal(err)
	}
	l, ok1 := local.(*unix.SockaddrInet4)
	p, ok2 := peer.(*unix.SockaddrInet4)
	if !ok1 || !ok2 {
		t.Fatal("not an IPv4 connection")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		t.Fatal(err)
	}
	// "sl local_address rem_address st tx_queue:rx_queue tr:tm->when
	// retrnsmt uid timeout inode ...", addresses as hex IP:port.
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || !hasPort(f[1], p.Port) || !hasPort(f[2], l.Port) {
			continue
		}
		ino, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return ino
	}
	t.Fatalf("no socket of port %d connected to port %d in /proc/%d/net/tcp", p.Port, l.Port, pid)
	return 0
}

func hasPort(addr string, port int) bool {
	_, hex, ok := strings.Cut(addr, ":")
	v, err := strconv.ParseUint(hex, 16, 16)
	return ok && err == nil && int(v) == port
}

// registered reports whether the socket of inode ino is registered with
// an epoll instance of process pid.
func registered(pid int, ino uint64) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if target, _ := os.Readlink(dir + "/" + e.Name()); target != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			_, rest, ok := strings.Cut(line, " ino:")
			if !strings.HasPrefix(line, "tfd:") || !ok {
				continue
			}
			if v, err := strconv.ParseUint(strings.Fields(rest)[0], 16, 64); err == nil && v == ino {
				return true
			}
		}
	}
	return false
}
