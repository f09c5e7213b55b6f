package appliance

import (
	"encoding/binary"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Generic receive and segmentation offload for UDP (Linux UDP_GRO and
// UDP_SEGMENT): the kernel hands a socket with UDP_GRO several datagrams of
// one flow as one buffer, and sends a buffer with a UDP_SEGMENT control
// message as datagrams of that size, so a batch of same-sized messages to
// one peer crosses the stack once. Both are optional: a kernel without
// them delivers and sends datagrams one by one.

// EnableGRO asks the kernel to coalesce received datagrams on c (a
// *net.UDPConn); it reports whether it did.
func EnableGRO(c syscall.Conn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = rc.Control(func(fd uintptr) {
		ok = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) == nil
	})
	return ok
}

// GROSize returns the segment size of a coalesced receive from its control
// messages, or 0 if the buffer is one datagram.
func GROSize(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_UDP && m.Header.Type == unix.UDP_GRO && len(m.Data) >= 4 {
			return int(binary.NativeEndian.Uint32(m.Data))
		}
	}
	return 0
}

// SplitGRO calls f for each datagram of a received buffer whose segment
// size is size (0: the buffer is one datagram).
func SplitGRO(buf []byte, size int, f func(d []byte)) {
	if size <= 0 || size >= len(buf) {
		f(buf)
		return
	}
	for len(buf) > 0 {
		n := min(size, len(buf))
		f(buf[:n])
		buf = buf[n:]
	}
}

// SegmentOOB appends a UDP_SEGMENT control message for segments of size
// bytes to oob.
func SegmentOOB(oob []byte, size int) []byte {
	b := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafePointer(&b[0]))
	h.Level = unix.IPPROTO_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(b[unix.CmsgLen(0):], uint16(size))
	return append(oob, b...)
}

// MaxGSOSegments bounds the datagrams of one segmented send (the kernel's
// UDP_MAX_SEGMENTS is 128; 64 keeps a send under 64 KiB for small ones).
const MaxGSOSegments = 64

// sameAddr reports whether two UDP addresses are the same peer.
func sameAddr(a, b net.Addr) bool {
	x, ok1 := a.(*net.UDPAddr)
	y, ok2 := b.(*net.UDPAddr)
	return ok1 && ok2 && x.Port == y.Port && x.IP.Equal(y.IP)
}
