package nbd

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The raw sockets' system calls that cannot block: read(2) and writev(2)
// on a non-blocking descriptor (they return EAGAIN instead of waiting) and
// ppoll(2) with a zero timeout.
//
// Why raw: syscall.Syscall brackets a call with the runtime's
// entersyscall/exitsyscall, so that a call that blocks hands its P (Go's
// right to run code) to another thread. When the process has been idle
// (every P idle, sysmon asleep), entersyscall wakes sysmon, which then
// polls every 20 µs until the process idles again: at queue depth 1 the
// process idles between every two requests, and sysmon took 20–23% of the
// perf samples of `rialto attach` and the agent under pgbench (docs/nbd.md,
// "Queue depth 1"). syscall.RawSyscall skips the bracket.
//
// The runtime's rules for a raw call: it must not block (its thread keeps
// the P, and sysmon cannot take it back), and the goroutine cannot be
// stopped for the garbage collector while it is in the call. Both are met
// by calls that never sleep and take microseconds. Everything that may
// block keeps the ordinary path: poll(2) with a timeout, blocking reads,
// fdatasync, pread/pwrite on files. The descriptors passed here must be
// non-blocking (newRawSock makes sure of it; sockets of the netpoller
// are).
//
// A non-blocking call is never interrupted by a signal (it never sleeps),
// so EINTR does not come; the loops retry it anyway.
//
// The race detector is not told about these calls (the unix package's
// Read annotates the buffer as written by the kernel): it misses nothing
// Go code does to the buffers, only the kernel's own accesses.

// rawRead reads fd, which must be non-blocking, once: n bytes (0 at the
// end of the stream), or an errno (EAGAIN: nothing to read yet).
func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return rawCall(unix.SYS_READ, fd, unsafe.Pointer(&p[0]), len(p))
}

// rawWritev writes iov to fd, which must be non-blocking, once: the bytes
// written (possibly fewer than iov holds), or an errno (EAGAIN: the socket
// takes nothing now). iov must not be empty.
func rawWritev(fd int, iov []unix.Iovec) (int, error) {
	return rawCall(unix.SYS_WRITEV, fd, unsafe.Pointer(&iov[0]), len(iov))
}

// rawCall makes system call trap on fd with buffer p of n (bytes, or
// iovecs), again on EINTR: its result, or an errno.
//
// p stays an unsafe.Pointer until the conversion in RawSyscall's argument
// list, which keeps the memory where it is until the call returns. The
// buffer may be on the caller's stack (rawSock.writev's iovec array is),
// and calling rawCall may grow the stack, which moves it: the runtime
// updates pointers into the stack, not a uintptr, so an address converted
// to a uintptr before this call would send the kernel to the old, freed
// stack, where another goroutine's data may be by then (one connection's
// request went out on another's so).
func rawCall(trap uintptr, fd int, p unsafe.Pointer, n int) (int, error) {
	for {
		r, _, e := syscall.RawSyscall(trap, uintptr(fd), uintptr(p), uintptr(n))
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		}
		return 0, e
	}
}

// pollNow reports whether fd is ready for ev now (ppoll(2) with a zero
// timeout), or hung up, or failed: the caller's next system call reports
// which. An error of ppoll itself counts as ready for the same reason.
func pollNow(fd int, ev int16) bool {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: ev}}
	var ts unix.Timespec
	for {
		k, _, e := syscall.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		switch e {
		case 0:
			return k > 0
		case unix.EINTR:
			continue
		}
		return true
	}
}

// rawPwrite writes p at off in fd, a file on tmpfs or ramfs, once: the
// bytes written, or an errno. Such a write copies into the page cache and
// never waits for a device; it may sleep only briefly, on the inode's lock
// (held by another write's copy) or in page reclaim.
func rawPwrite(fd int, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := syscall.RawSyscall6(unix.SYS_PWRITE64, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), uintptr(off), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
