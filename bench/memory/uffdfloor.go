package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/internal/dataplane/memory/uffd"
)

// The userfaultfd floor: the same kind of mapping as mapping.Map (a memfd
// mapped shared, registered in missing and write-protect modes) with its
// faults served by a thread of this process that busy-polls the
// userfaultfd and installs a page that is already in memory (UFFDIO_COPY in
// write-protected mode): no network, no handler process, no bookkeeping.
// A mapped remote fault costs at least this plus the loopback round trip of
// floor.go.
//
// The chain floor is the same probe served by a process of its own (as a
// mapping's faults are) that fetches each page from the floor probe's server
// (floor.go) before installing it: the whole path of a mapped remote fault,
// measured end to end, with nothing in it but the system calls (no framing,
// no cache bookkeeping).

const uffdFloorPages = 32768 // 128 MiB: every measured touch is a first touch

// uffdFloor times n first touches of random pages (n ≤ uffdFloorPages),
// served in this process from memory, or, given the address of a floor
// probe's server, by a chain-handler process fetching them from it.
func uffdFloor(n int, donor string) ([]time.Duration, error) {
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
	// unblock lets the measuring thread go on without a handler (its
	// touches become plain memory faults) and returns err.
	unblock := func(err error) error {
		_ = u.Unregister(base, uintptr(size))
		return err
	}

	// A thread blocked on a fault must not hold up a collection that the
	// handler's thread would wait for: no collection during the probe.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var stop atomic.Bool
	done := make(chan error, 1)
	var child *exec.Cmd
	if donor != "" {
		if child, err = startChainHandler(u, base, donor); err != nil {
			return nil, err
		}
		go func() {
			err := child.Wait()
			if !stop.Load() {
				done <- unblock(fmt.Errorf("chain handler: %v", err))
				return
			}
			done <- nil
		}()
	} else {
		// Three threads spin in Go code (system calls that keep their
		// P): each needs a P of its own, or one would wait for
		// preemption.
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 4)))
		page := make([]byte, 4096)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			err := serveFaults(u, page, nil, stop.Load)
			done <- unblock(err)
		}()
		// A third thread yields in a loop, as the donor's polling
		// thread does during a remote fault: with it, neither CPU of a
		// small machine idles while a fault is served (waking a halted
		// virtual CPU costs more than the rest of the hand-off).
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
	}

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
	if donor != "" {
		_ = child.Process.Kill()
	}
	if err := <-done; err != nil {
		return nil, err
	}
	if sink != 0 { // every installed page starts with 0
		return nil, fmt.Errorf("uffd floor: read %d, want 0", sink)
	}
	return lat, nil
}

// serveFaults installs the page of each missing-page fault read from u
// (write-protected, as a mapping installs a read fault) until stop says so
// or an error: page's content, or what fetch puts in page for the fault's
// address. Between empty reads it yields the CPU.
func serveFaults(u *uffd.FD, page []byte, fetch func(addr uintptr) error, stop func() bool) error {
	buf := make([]byte, 64*uffd.MsgSize)
	msgs := make([]uffd.Msg, 0, 64)
	src := uintptr(unsafe.Pointer(&page[0]))
	for !stop() {
		var err error
		msgs, err = u.Read(buf, msgs[:0])
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			continue
		}
		for _, m := range msgs {
			addr := uintptr(m.Address) &^ 4095
			if fetch != nil {
				if err := fetch(addr); err != nil {
					return fmt.Errorf("fetch: %w", err)
				}
			}
			if _, err := u.Copy(addr, src, 4096, true); err != nil && err != unix.EEXIST {
				return fmt.Errorf("UFFDIO_COPY: %w", err)
			}
		}
	}
	runtime.KeepAlive(page)
	return nil
}

// chainHandlerArg is the argument that makes memory-bench the chain floor's
// handler process: memory-bench chain-handler DONOR BASE FEATURES, with the
// userfaultfd (negotiated FEATURES) as descriptor 3.
const chainHandlerArg = "chain-handler"

// startChainHandler starts the chain floor's handler process and waits
// until it serves faults.
func startChainHandler(u *uffd.FD, base uintptr, donor string) (*exec.Cmd, error) {
	uf, err := unix.FcntlInt(uintptr(u.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(uf), "userfaultfd")
	defer f.Close()
	cmd := exec.Command("/proc/self/exe", chainHandlerArg, donor, strconv.FormatUint(uint64(base), 10),
		strconv.FormatUint(u.Features, 10))
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("chain handler did not start: %q %v", line, err)
	}
	return cmd, nil
}

// chainHandler is the chain handler process: it fetches each faulting page
// from the floor probe's server (a 16-byte request naming the page, a
// 16-byte header and the page back) and installs it, until it is killed or
// its parent is gone.
func chainHandler(args []string) {
	if len(args) != 3 {
		fail(fmt.Errorf("usage: memory-bench %s DONOR BASE FEATURES", chainHandlerArg))
	}
	base, err1 := strconv.ParseUint(args[1], 10, 64)
	features, err2 := strconv.ParseUint(args[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		fail(err)
	}
	runtime.LockOSThread()
	c, err := net.Dial("tcp", args[0])
	if err != nil {
		fail(err)
	}
	fd, f, err := rawFd(c)
	if err != nil {
		fail(err)
	}
	defer f.Close()
	if err := unix.SetNonblock(3, true); err != nil {
		fail(err)
	}
	u := uffd.FromFd(3, features)
	var req [16]byte
	// The header lands right before a page-aligned page.
	buf, err := unix.Mmap(-1, 0, 2*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fail(err)
	}
	rep := buf[4096-16:]
	fetch := func(addr uintptr) error {
		binary.BigEndian.PutUint64(req[:], uint64(addr-uintptr(base))/4096)
		if err := sendAll(fd, [][]byte{req[:]}); err != nil {
			return err
		}
		return spinRecv(fd, rep)
	}
	parent, spins := os.Getppid(), 0
	fmt.Println("ready")
	err = serveFaults(u, rep[16:], fetch, func() bool {
		spins++
		return spins%1024 == 0 && os.Getppid() != parent
	})
	if err != nil {
		fail(err)
	}
}
