package nbd

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// mappedSource is implemented by backends whose bytes are in memory and
// mapped into the process: a read reply then points into the mapping and
// the kernel copies it straight to the socket, with no pread and no copy
// into a buffer. mapRange returns ok=false when the range must be read the
// ordinary way; after ok=true the caller must call unmapRange once the
// bytes are sent.
type mappedSource interface {
	mapRange(off, n int64) (p []byte, ok bool)
	unmapRange()
}

// fileMap is a shared mapping of a FileBackend's partition, kept for files
// on tmpfs or ramfs (writable unless the backend is read-only). Its bytes
// are handed to system calls (writev, read), never read by Go code: if the
// file is truncated under it, or a tmpfs has no page for it, the system
// call fails with EFAULT instead of the process faulting. The one
// exception writes into it: a TLS write's payload decrypted straight into
// the mapping (mapwrite.go, mappedWrite), with the goroutine's faults
// turned into panics it recovers from; either way such a write is finished
// with pwrite (writeRest).
//
// Reads through the mapping are only used for chunks the allocation bitmap
// says may hold data, because faulting in a hole of a tmpfs file allocates
// a page where pread would return zeroes without allocating.
type fileMap struct {
	mem      []byte // whole mapping (page-aligned start)
	skew     int64  // partition start within mem
	writable bool   // mapped PROT_WRITE too

	refs   atomic.Int64 // ranges handed out and not yet released
	closed atomic.Bool
	once   sync.Once
}

// newFileMap maps [base, base+size) of fd, writable if asked and
// possible, or returns nil.
func newFileMap(fd int, base, size int64, writable bool) *fileMap {
	if size <= 0 || int64(int(size)) != size {
		return nil
	}
	pg := int64(unix.Getpagesize())
	start := base &^ (pg - 1)
	if writable {
		mem, err := unix.Mmap(fd, start, int(base+size-start), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err == nil {
			return &fileMap{mem: mem, skew: base - start, writable: true}
		}
	}
	mem, err := unix.Mmap(fd, start, int(base+size-start), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil
	}
	return &fileMap{mem: mem, skew: base - start}
}

// get returns the mapped bytes of [off, off+n) of the partition and takes a
// reference, or ok=false once the map is closed.
func (m *fileMap) get(off, n int64) ([]byte, bool) {
	m.refs.Add(1)
	if m.closed.Load() {
		m.put()
		return nil, false
	}
	s := m.skew + off
	return m.mem[s : s+n : s+n], true
}

// put releases a reference taken by get.
func (m *fileMap) put() {
	if m.refs.Add(-1) == 0 && m.closed.Load() {
		m.unmap()
	}
}

// close unmaps the file once no range is outstanding.
func (m *fileMap) close() {
	m.closed.Store(true)
	if m.refs.Load() == 0 {
		m.unmap()
	}
}

func (m *fileMap) unmap() {
	m.once.Do(func() { unix.Munmap(m.mem) })
}
