package main

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The platform floor: a TCP round trip on loopback with both ends
// busy-polling a non-blocking socket with raw system calls (no Rialto code):
// a 16-byte request naming an offset, a 16-byte header and 4 KiB of memory
// back. A mapped fault costs at least this plus the userfaultfd hand-offs.

const floorRegion = 64 << 20

// serveFloor answers floor probes on ln until it is closed.
func serveFloor(ln net.Listener) {
	mem := make([]byte, floorRegion)
	for i := range mem {
		mem[i] = byte(i)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			runtime.LockOSThread()
			defer c.Close()
			fd, f, err := rawFd(c)
			if err != nil {
				return
			}
			defer f.Close()
			var req, hdr [16]byte
			for {
				if spinRecv(fd, req[:]) != nil {
					return
				}
				off := binary.BigEndian.Uint64(req[:]) % (floorRegion / 4096) * 4096
				if sendAll(fd, [][]byte{hdr[:], mem[off : off+4096]}) != nil {
					return
				}
			}
		}()
	}
}

// floorRTT times n probes against addr and returns their latencies.
func floorRTT(addr string, n int) ([]time.Duration, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	fd, f, err := rawFd(c)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return timeProbes(n, func(req, rep []byte) error {
		if err := sendAll(fd, [][]byte{req}); err != nil {
			return err
		}
		return spinRecv(fd, rep)
	})
}

// syscallCost returns the median cost in nanoseconds of a system call
// (getpid, which does nothing) over 21 batches of 10,000.
func syscallCost() float64 {
	var per []float64
	for range 21 {
		t := time.Now()
		for range 10000 {
			_, _, _ = unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)
		}
		per = append(per, float64(time.Since(t).Nanoseconds())/10000)
	}
	slices.Sort(per)
	return per[len(per)/2]
}

// timeProbes times n round trips (a 16-byte request naming a random
// offset, a 16-byte header and 4 KiB back) on a locked thread.
func timeProbes(n int, roundTrip func(req, rep []byte) error) ([]time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var req [16]byte
	rep := make([]byte, 16+4096)
	rng := rand.New(rand.NewPCG(3, 3))
	lat := make([]time.Duration, 0, n)
	for range n {
		binary.BigEndian.PutUint64(req[:], rng.Uint64())
		t := time.Now()
		if err := roundTrip(req[:], rep); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t))
	}
	return lat, nil
}

// rawFd returns a non-blocking duplicate of c's descriptor that Go's
// netpoller does not know, and closes c (which takes the original off the
// netpoller): a registered descriptor wakes an idle runtime thread at every
// arrival, which this VM measurably pays in each round trip. The file owns
// the duplicate.
func rawFd(c net.Conn) (int, *os.File, error) {
	defer c.Close()
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, nil, fmt.Errorf("floor: %T has no descriptor", c)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetNoDelay(true); err != nil {
			return 0, nil, err
		}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, nil, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return 0, nil, err
	}
	if derr != nil {
		return 0, nil, derr
	}
	// Blocking while os.NewFile looks, so that it does not register it.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return 0, nil, err
	}
	f := os.NewFile(uintptr(fd), "floor")
	if err := unix.SetNonblock(fd, true); err != nil {
		f.Close()
		return 0, nil, err
	}
	return fd, f, nil
}

// spinRecv fills b, re-trying (with sched_yield) while nothing has arrived.
func spinRecv(fd int, b []byte) error {
	for got := 0; got < len(b); {
		n, err := unix.Read(fd, b[got:])
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("floor: EOF")
		default:
			got += n
		}
	}
	return nil
}

func sendAll(fd int, bufs [][]byte) error {
	for len(bufs) > 0 {
		n, err := unix.Writev(fd, bufs)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		for n > 0 {
			if n >= len(bufs[0]) {
				n -= len(bufs[0])
				bufs = bufs[1:]
			} else {
				bufs[0] = bufs[0][n:]
				n = 0
			}
		}
	}
	return nil
}

// serveFloorUDP answers floor probes sent as datagrams to addr (a
// 16-byte request; a 16-byte header and 4 KiB back in one datagram) from a
// polling thread that lives as long as the process.
func serveFloorUDP(addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	fd, f, err := rawFd(pc.(*net.UDPConn))
	if err != nil {
		return err
	}
	mem := make([]byte, floorRegion)
	for i := range mem {
		mem[i] = byte(i)
	}
	go func() {
		runtime.LockOSThread()
		defer f.Close() // keeps f, which owns fd, reachable: the thread serves until the process ends
		var req [16]byte
		rep := make([]byte, 16+4096)
		last := time.Now()
		for {
			n, from, err := unix.Recvfrom(fd, req[:], 0)
			if err == unix.EAGAIN || err == unix.EINTR {
				// Poll while probes come (as the TCP probe's server does
				// for its connection's life); sleep between probe runs.
				if time.Since(last) < 10*time.Millisecond {
					_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
				} else {
					_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
					last = time.Now()
				}
				continue
			}
			last = time.Now()
			if err != nil || n != len(req) {
				continue
			}
			off := binary.BigEndian.Uint64(req[:]) % (floorRegion / 4096) * 4096
			copy(rep[16:], mem[off:off+4096])
			_ = unix.Sendto(fd, rep, 0, from)
		}
	}()
	return nil
}

// floorUDP times n datagram probes against addr (a connected socket,
// polled like the TCP probe).
func floorUDP(addr string, n int) ([]time.Duration, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return nil, err
	}
	fd, f, err := rawFd(c)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return timeProbes(n, func(req, rep []byte) error {
		if _, err := unix.Write(fd, req); err != nil {
			return err
		}
		for spins := 0; ; spins++ {
			k, err := unix.Read(fd, rep)
			switch {
			case err == unix.EAGAIN || err == unix.EINTR:
				_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
				// A lost datagram (none are lost on loopback or an
				// unshaped veth) ends the probe rather than spinning on.
				if spins%1024 == 1023 {
					pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
					if k, _ := unix.Poll(pfd, 1000); k == 0 {
						return fmt.Errorf("floor: no reply datagram within 1s")
					}
				}
			case err != nil:
				return err
			case k != len(rep):
				return fmt.Errorf("floor: datagram of %d bytes", k)
			default:
				return nil
			}
		}
	})
}
