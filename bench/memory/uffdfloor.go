package main

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/internal/dataplane/memory/uffd"
)

// The userfaultfd floor: the same kind of mapping as memory.Map (a memfd
// mapped shared, registered in missing and write-protect modes) with its
// faults served by a thread of this process that busy-polls the
// userfaultfd and installs a page that is already in memory (UFFDIO_COPY in
// write-protected mode): no network, no handler process, no bookkeeping.
// A mapped remote fault costs at least this plus the loopback round trip of
// floor.go.

const uffdFloorPages = 32768 // 128 MiB: every measured touch is a first touch

// uffdFloor times n first touches of random pages (n ≤ uffdFloorPages).
func uffdFloor(n int) ([]time.Duration, error) {
	n = min(n, uffdFloorPages)
	size := uffdFloorPages * 4096
	fd, err := unix.MemfdCreate("uffd-floor", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	defer unix.Munmap(mem)
	base := uintptr(unsafe.Pointer(&mem[0]))
	u, err := uffd.Open(uffd.FeaturePagefaultFlagWP | uffd.FeatureMissingShmem | uffd.FeatureWPShmem)
	if err != nil {
		return nil, err
	}
	defer u.Close()
	if err := u.Register(base, uintptr(size), uffd.ModeMissing|uffd.ModeWP); err != nil {
		return nil, err
	}

	// A thread blocked on a fault must not hold up a collection that the
	// handler's thread would wait for: no collection during the probe.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// Three threads spin in Go code (system calls that keep their P): each
	// needs a P of its own, or one would wait for preemption.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 4)))
	page := make([]byte, 4096)
	for i := range page {
		page[i] = byte(i)
	}
	var stop atomic.Bool
	done := make(chan error, 1)
	// unblock lets the measuring thread go on without this handler (its
	// touches become plain memory faults) and returns err.
	unblock := func(err error) error {
		_ = u.Unregister(base, uintptr(size))
		return err
	}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		buf := make([]byte, 64*uffd.MsgSize)
		msgs := make([]uffd.Msg, 0, 64)
		src := uintptr(unsafe.Pointer(&page[0]))
		for !stop.Load() {
			var err error
			msgs, err = u.Read(buf, msgs[:0])
			if err != nil {
				done <- unblock(err)
				return
			}
			if len(msgs) == 0 {
				_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
				continue
			}
			for _, m := range msgs {
				addr := uintptr(m.Address) &^ 4095
				if _, err := u.Copy(addr, src, 4096, true); err != nil && err != unix.EEXIST {
					done <- unblock(fmt.Errorf("UFFDIO_COPY: %w", err))
					return
				}
			}
		}
		done <- nil
	}()

	// A third thread yields in a loop, as the donor's polling thread does
	// during a remote fault: with it, neither CPU of a small machine idles
	// while a fault is served (waking a halted virtual CPU costs more than
	// the rest of the hand-off).
	awake := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for !stop.Load() {
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
		close(awake)
	}()
	defer func() { stop.Store(true); <-awake }()

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	order := rand.New(rand.NewPCG(5, 5)).Perm(uffdFloorPages)[:n]
	lat := make([]time.Duration, 0, n)
	var sink byte
	for _, p := range order {
		t := time.Now()
		sink += mem[p*4096]
		lat = append(lat, time.Since(t))
	}
	stop.Store(true)
	runtime.KeepAlive(page)
	if err := <-done; err != nil {
		return nil, err
	}
	if sink != 0 { // page[0] is 0: every touch read the installed page
		return nil, fmt.Errorf("uffd floor: read %d, want 0", sink)
	}
	return lat, nil
}
