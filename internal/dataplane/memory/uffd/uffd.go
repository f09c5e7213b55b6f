package uffd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrUnavailable reports that the kernel refused userfaultfd (disabled,
// not permitted, or without the features Rialto needs).
var ErrUnavailable = errors.New("uffd: userfaultfd unavailable")

// ioctl numbers and flags from <linux/userfaultfd.h>.
const (
	uffdAPI = 0xAA

	ioAPI          = 0xC018AA3F
	ioRegister     = 0xC020AA00
	ioUnregister   = 0x8010AA01
	ioWake         = 0x8010AA02
	ioCopy         = 0xC028AA03
	ioWriteProtect = 0xC018AA06
	ioPoison       = 0xC020AA08 // UFFDIO_POISON (Linux 6.6)
	ioDevNew       = 0xAA00     // USERFAULTFD_IOC_NEW on /dev/userfaultfd

	FeaturePagefaultFlagWP = 1 << 0
	FeatureMissingShmem    = 1 << 5  // missing mode on shmem/memfd
	FeatureWPShmem         = 1 << 12 // write-protect mode on shmem/memfd
	FeaturePoison          = 1 << 14 // UFFDIO_POISON

	ModeMissing = 1
	ModeWP      = 2

	copyModeWP     = 2
	wpModeWP       = 1
	wpModeDontWake = 2

	EventPagefault = 0x12

	FlagWrite = 1 // UFFD_PAGEFAULT_FLAG_WRITE
	FlagWP    = 2 // UFFD_PAGEFAULT_FLAG_WP

	MsgSize = 32
)

// FD is a userfaultfd file descriptor (non-blocking, close-on-exec).
type FD struct {
	fd       int
	Features uint64
}

// Open creates a userfaultfd through the syscall, falling back to
// /dev/userfaultfd, and negotiates the API with the wanted features.
func Open(features uint64) (*FD, error) {
	r, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	fd := int(r)
	if errno != 0 {
		dev, err := os.OpenFile("/dev/userfaultfd", os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: userfaultfd(2): %v; /dev/userfaultfd: %v", ErrUnavailable, errno, err)
		}
		r, _, e2 := unix.Syscall(unix.SYS_IOCTL, dev.Fd(), ioDevNew, unix.O_CLOEXEC|unix.O_NONBLOCK)
		_ = dev.Close()
		if e2 != 0 {
			return nil, fmt.Errorf("%w: userfaultfd(2): %v; USERFAULTFD_IOC_NEW: %v", ErrUnavailable, errno, e2)
		}
		fd = int(r)
	}
	api := [3]uint64{uffdAPI, features, 0}
	if err := ioctl(fd, ioAPI, unsafe.Pointer(&api)); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("%w: UFFDIO_API features %#x: %v", ErrUnavailable, features, err)
	}
	if api[1]&features != features {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("%w: features %#x not supported (have %#x)", ErrUnavailable, features, api[1])
	}
	return &FD{fd: fd, Features: api[1]}, nil
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

// FromFd wraps a userfaultfd descriptor inherited from the process that
// created and registered it (the ioctls act on that process's memory).
func FromFd(fd int, features uint64) *FD { return &FD{fd: fd, Features: features} }

// Fd returns the descriptor, for polling.
func (u *FD) Fd() int { return u.fd }

// Close closes the descriptor.
func (u *FD) Close() error { return unix.Close(u.fd) }

// Register registers [start, start+length) with the given modes.
func (u *FD) Register(start, length uintptr, mode uint64) error {
	reg := [4]uint64{uint64(start), uint64(length), mode, 0}
	if err := ioctl(u.fd, ioRegister, unsafe.Pointer(&reg)); err != nil {
		return fmt.Errorf("%w: UFFDIO_REGISTER mode %d: %v", ErrUnavailable, mode, err)
	}
	return nil
}

// Unregister removes the range.
func (u *FD) Unregister(start, length uintptr) error {
	rng := [2]uint64{uint64(start), uint64(length)}
	return ioctl(u.fd, ioUnregister, unsafe.Pointer(&rng))
}

// Copy atomically installs length bytes from src at dst (both page
// aligned), waking the faulting threads. With wp the pages are installed
// write-protected. It returns the bytes copied; EEXIST means a page was
// already present.
func (u *FD) Copy(dst, src, length uintptr, wp bool) (int64, error) {
	var mode uint64
	if wp {
		mode |= copyModeWP
	}
	arg := [5]uint64{uint64(dst), uint64(src), uint64(length), mode, 0}
	err := ioctl(u.fd, ioCopy, unsafe.Pointer(&arg))
	return int64(arg[4]), err
}

// WriteProtect sets (wp) or clears write protection on the range; clearing
// wakes the threads waiting on it unless dontWake.
func (u *FD) WriteProtect(start, length uintptr, wp, dontWake bool) error {
	var mode uint64
	if wp {
		mode |= wpModeWP
	}
	if dontWake {
		mode |= wpModeDontWake
	}
	arg := [3]uint64{uint64(start), uint64(length), mode}
	return ioctl(u.fd, ioWriteProtect, unsafe.Pointer(&arg))
}

// Poison installs poison markers over the missing pages of the range and
// wakes the threads waiting on them: touching such a page raises SIGBUS.
// Pages already present are left alone (the kernel reports EEXIST after
// poisoning the ones before them; Poison carries on past them).
func (u *FD) Poison(start, length uintptr, pageSize int) error {
	for length > 0 {
		arg := [4]uint64{uint64(start), uint64(length), 0, 0}
		err := ioctl(u.fd, ioPoison, unsafe.Pointer(&arg))
		done := uintptr(max(int64(arg[3]), 0))
		switch {
		case err == nil:
			return nil
		case err == unix.EAGAIN:
		case err == unix.EEXIST:
			done += uintptr(pageSize) // skip the present page
		default:
			return err
		}
		done = min(done, length)
		start, length = start+done, length-done
	}
	return nil
}

// Wake wakes threads waiting on faults in the range.
func (u *FD) Wake(start, length uintptr) error {
	rng := [2]uint64{uint64(start), uint64(length)}
	return ioctl(u.fd, ioWake, unsafe.Pointer(&rng))
}

// Msg is a decoded page-fault message.
type Msg struct {
	Event   uint8
	Flags   uint64
	Address uint64
}

// Read reads up to len(buf)/MsgSize messages without blocking. It returns
// (nil, nil) when none is pending.
func (u *FD) Read(buf []byte, out []Msg) ([]Msg, error) {
	n, err := unix.Read(u.fd, buf)
	if err == unix.EAGAIN || err == unix.EINTR {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	for i := 0; i+MsgSize <= n; i += MsgSize {
		m := buf[i : i+MsgSize]
		out = append(out, Msg{Event: m[0],
			Flags:   binary.NativeEndian.Uint64(m[8:]),
			Address: binary.NativeEndian.Uint64(m[16:])})
	}
	return out, nil
}
