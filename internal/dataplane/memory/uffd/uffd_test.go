package uffd

import (
	"errors"
	"runtime"
	"runtime/debug"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestMissingAndWriteProtect(t *testing.T) {
	u, err := Open(FeaturePagefaultFlagWP)
	if errors.Is(err, ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	const pages = 16
	ps := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, pages*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	src, _ := unix.Mmap(-1, 0, ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	defer unix.Munmap(src)
	base := uintptr(unsafe.Pointer(&mem[0]))
	if err := u.Register(base, uintptr(len(mem)), ModeMissing|ModeWP); err != nil {
		t.Fatal(err)
	}
	stop, _ := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	defer unix.Close(stop)
	var missing, wp int
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		buf := make([]byte, 16*MsgSize)
		var msgs []Msg
		for {
			fds := []unix.PollFd{{Fd: int32(u.Fd()), Events: unix.POLLIN}, {Fd: int32(stop), Events: unix.POLLIN}}
			if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
				done <- err
				return
			}
			if fds[1].Revents != 0 {
				done <- nil
				return
			}
			msgs, err = u.Read(buf, msgs[:0])
			if err != nil {
				done <- err
				return
			}
			for _, m := range msgs {
				page := uintptr(m.Address) &^ uintptr(ps-1)
				if m.Flags&FlagWP != 0 {
					wp++
					if err := u.WriteProtect(page, uintptr(ps), false, false); err != nil {
						done <- err
						return
					}
					continue
				}
				missing++
				idx := int(page-base) / ps
				for i := range src {
					src[i] = byte(idx)
				}
				if _, err := u.Copy(page, uintptr(unsafe.Pointer(&src[0])), uintptr(ps), true); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	for i := range pages {
		if mem[i*ps+5] != byte(i) {
			t.Fatalf("page %d: %d", i, mem[i*ps+5])
		}
	}
	mem[3*ps] = 99 // write-protect fault, then succeeds
	mem[3*ps+1] = 98
	if err := unix.Madvise(mem[4*ps:5*ps], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if mem[4*ps] != 4 { // zapped page faults as missing again
		t.Fatal("zapped page")
	}
	_, _ = unix.Write(stop, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if missing != pages+1 || wp != 1 || mem[3*ps] != 99 {
		t.Fatalf("missing %d wp %d", missing, wp)
	}
}

// A poisoned missing page raises SIGBUS (a panic under SetPanicOnFault)
// instead of waiting for a handler; present pages are left alone.
func TestPoison(t *testing.T) {
	u, err := Open(FeaturePoison)
	if errors.Is(err, ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ps := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 4*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	base := uintptr(unsafe.Pointer(&mem[0]))
	src, _ := unix.Mmap(-1, 0, ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	defer unix.Munmap(src)
	src[0] = 42
	if err := u.Register(base, uintptr(len(mem)), ModeMissing); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Copy(base+uintptr(ps), uintptr(unsafe.Pointer(&src[0])), uintptr(ps), false); err != nil {
		t.Fatal(err)
	}
	if err := u.Poison(base, uintptr(len(mem)), ps); err != nil {
		t.Fatal(err)
	}
	if mem[ps] != 42 {
		t.Fatal("present page changed")
	}
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	for _, p := range []int{0, 2, 3} {
		func() {
			defer func() {
				if _, ok := recover().(interface{ Addr() uintptr }); !ok {
					t.Errorf("page %d: touch did not fault", p)
				}
			}()
			sink = mem[p*ps]
		}()
	}
}

var sink byte
