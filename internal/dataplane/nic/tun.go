package nic

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// openTUN creates (or attaches to) the TUN interface name in the calling
// thread's network namespace, without packet information headers, and
// returns it as a pollable file: Read and Write carry one IP packet each,
// and Close unblocks a pending Read. The interface is not persistent: it
// disappears with the last descriptor, so a crashed process leaves none.
// closeTUN, not Close, ends it: see there.
func openTUN(name string) (*os.File, error) {
	if len(name) == 0 || len(name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("nic: interface name %q (1..%d bytes)", name, unix.IFNAMSIZ-1)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("nic: open /dev/net/tun: %w", err)
	}
	var req struct {
		name  [unix.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(req.name[:], name)
	req.flags = unix.IFF_TUN | unix.IFF_NO_PI
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(unix.TUNSETIFF), uintptr(unsafe.Pointer(&req))); e != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("nic: TUNSETIFF %s: %w", name, e)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// closeTUN closes the TUN interface f (named name) and deletes it. Its
// descriptor's close alone does not, for a moment: the interface goes
// with the last descriptor of its open file description, which a child
// process that any goroutine forked (an nft, an exec.Command) shares until
// its exec closes its copy, tens of milliseconds on a loaded machine.
// Meanwhile the interface kept its address and routes, and opening it
// again (the lease served again: restored by the next agent of the
// process, or attached again) failed with EBUSY. So the interface is
// deleted (netlink) once f is closed, through a duplicate of the
// descriptor taken first, which keeps the name this interface's until
// then; a pending Read returns os.ErrClosed as after Close.
func closeTUN(f *os.File, name string) error {
	dup := -1
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if d, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0); err == nil {
				dup = d
			}
		})
	}
	err := f.Close()
	if dup >= 0 {
		if l, lerr := netlink.LinkByName(name); lerr == nil {
			_ = netlink.LinkDel(l)
		}
		_ = unix.Close(dup)
	}
	return err
}

// linkUp sets the interface's MTU and a short transmit queue (the queue
// in front of a tunnel end that is out of credit or rate) and brings it up.
func linkUp(name string, mtu, txqlen int) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("nic: %s: %w", name, err)
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return nil, fmt.Errorf("nic: %s mtu %d: %w", name, mtu, err)
	}
	if txqlen > 0 {
		if err := netlink.LinkSetTxQLen(l, txqlen); err != nil {
			return nil, fmt.Errorf("nic: %s txqueuelen: %w", name, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("nic: %s up: %w", name, err)
	}
	return l, nil
}

// sysctl writes a value under /proc/sys/net.
func sysctl(path, value string) error {
	if err := os.WriteFile("/proc/sys/net/"+path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("nic: sysctl net/%s=%s: %w", path, value, err)
	}
	return nil
}

func readSysctl(path string) string {
	b, _ := os.ReadFile("/proc/sys/net/" + path)
	return string(b)
}
