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
