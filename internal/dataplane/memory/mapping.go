package memory

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/rialto-project/rialto/internal/dataplane/memory/uffd"
	"golang.org/x/sys/unix"
)

// ErrUffdUnavailable reports that userfaultfd was refused, so Map cannot
// build a transparent mapping; the explicit channels keep working.
var ErrUffdUnavailable = errors.New("memory: userfaultfd unavailable; use the explicit channels")

// ErrMappingFailed is wrapped by Mapping.Err after the mapping could not
// fetch or write back a page (the donor was lost).
var ErrMappingFailed = errors.New("memory: mapping failed")

// openUffd is replaced by tests to simulate a kernel that refuses.
var openUffd = uffd.Open

// MapOptions tune a Mapping. The zero value maps the whole region with a
// cache of 10% of it.
type MapOptions struct {
	// CacheBytes is the local cache size. Default: 10% of the mapped
	// length, at least 16 pages.
	CacheBytes int64
	// Readahead is the largest number of pages fetched for one fault when
	// faults are sequential (the window doubles from 1 on each sequential
	// fault). Default 64 (256 KiB); 1 disables readahead.
	Readahead int
	// EvictBatch is how many pages are evicted together when the cache is
	// full (dirty neighbours are written back in one request). Default 32.
	EvictBatch int
}

// MappingStats counts what a Mapping did.
type MappingStats struct {
	Faults      int64         // missing-page faults served
	WPFaults    int64         // first writes to clean pages
	PreDirtied  int64         // read faults installed writable because writes were likely
	PagesIn     int64         // pages fetched (including readahead)
	Evictions   int64         // pages evicted
	WriteBacks  int64         // dirty pages written back
	FetchTime   time.Duration // total time waiting for the donor's pages
	InstallTime time.Duration // total time in UFFDIO_COPY
	EvictTime   time.Duration // total time evicting (write-back included)
	Resident    int           // pages in the cache now
	CachePages  int
	ServiceTime []time.Duration // per missing fault, handler side (last 64Ki)
}

// Mapping is a transparent view of a remote region: Bytes returns ordinary
// memory whose pages are fetched from the donor on first touch.
//
// Design: the region is mmap'd anonymous memory registered with
// userfaultfd in missing and write-protect modes. A handler goroutine locked
// to its own OS thread serves faults over its own connection to the
// donor (raw syscalls, no Go netpoller on the fault path). Pages are
// installed write-protected, so the first write to a page raises a WP fault
// that marks it dirty and lifts the protection; clean pages are never
// written back. When the cache is full the least recently faulted pages
// (recency is updated on fault-in and on first write: the handler cannot see
// plain loads of resident pages) are evicted: dirty ones are write-protected,
// written back, then every victim is dropped with MADV_DONTNEED so that its
// next touch faults again. Sequential faults grow a readahead window. When
// most read-faulted pages end up written (read-modify-write), read faults
// install the page writable and dirty directly, saving the second fault.
type Mapping struct {
	c     *Client
	mem   []byte
	base  uintptr
	ps    int
	pages int
	u     *uffd.FD
	stop  int // eventfd
	pg    *pager
	stage []byte // mmap'd staging buffer for UFFDIO_COPY

	mu       sync.Mutex
	resident []bool
	dirty    []bool
	// probed marks pages installed write-protected by a read fault and not
	// yet written: their fate (written or evicted clean) feeds writeRate,
	// the moving estimate of how often a faulted page gets written.
	probed    []bool
	writeRate float64
	faultSeq  uint64
	prev      []int32 // LRU links; index pages is the sentinel
	next      []int32
	nres      int
	capPages  int
	maxRA     int
	raWin     int
	seqNext   int
	batch     int
	stats     MappingStats
	svc       []time.Duration
	svcN      int
	err       error

	done   chan struct{}
	closed bool
}

// Map maps the client's whole region (rounded down to pages) over its own
// connection of the client's session. It returns an error wrapping
// ErrUffdUnavailable when userfaultfd is refused. Close the Mapping before
// the Client.
func Map(ctx context.Context, c *Client, opts MapOptions) (*Mapping, error) {
	ps := os.Getpagesize()
	size := c.Size() / int64(ps) * int64(ps)
	if size == 0 {
		return nil, fmt.Errorf("memory: region of %d bytes is smaller than a page", c.Size())
	}
	if size > int64(int(^uint(0)>>1)) {
		return nil, fmt.Errorf("memory: region too large to map")
	}
	pages := int(size / int64(ps))
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = size / 10
	}
	capPages := max(int(opts.CacheBytes/int64(ps)), 16)
	if opts.Readahead <= 0 {
		opts.Readahead = 64
	}
	opts.Readahead = min(opts.Readahead, MaxPayload/ps, capPages/2)
	if opts.EvictBatch <= 0 {
		opts.EvictBatch = 32
	}
	u, err := openUffd(uffd.FeaturePagefaultFlagWP)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUffdUnavailable, err)
	}
	m := &Mapping{c: c, ps: ps, pages: pages, u: u, stop: -1, capPages: capPages,
		maxRA: max(opts.Readahead, 1), raWin: 1, seqNext: -1, batch: min(opts.EvictBatch, capPages/2),
		resident: make([]bool, pages), dirty: make([]bool, pages), probed: make([]bool, pages),
		prev: make([]int32, pages+1), next: make([]int32, pages+1),
		svc: make([]time.Duration, 0, 1<<16), done: make(chan struct{})}
	m.prev[pages], m.next[pages] = int32(pages), int32(pages)
	ok := false
	defer func() {
		if !ok {
			m.release()
		}
	}()
	if m.mem, err = unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE); err != nil {
		return nil, fmt.Errorf("memory: mmap %d bytes: %w", size, err)
	}
	m.base = uintptr(unsafe.Pointer(&m.mem[0]))
	if m.stage, err = unix.Mmap(-1, 0, m.maxRA*ps, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("memory: mmap staging: %w", err)
	}
	if err := u.Register(m.base, uintptr(size), uffd.ModeMissing|uffd.ModeWP); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUffdUnavailable, err)
	}
	if m.stop, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, fmt.Errorf("memory: eventfd: %w", err)
	}
	if m.pg, err = c.newPager(ctx); err != nil {
		return nil, err
	}
	ok = true
	go m.handler()
	return m, nil
}

// Bytes is the mapped region. It stays valid until Close; do not touch it
// during or after Close.
func (m *Mapping) Bytes() []byte { return m.mem }

// Err reports why the mapping failed, if it did.
func (m *Mapping) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Stats returns counters and the recent fault service times.
func (m *Mapping) Stats() MappingStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Resident, s.CachePages = m.nres, m.capPages
	s.ServiceTime = slices.Clone(m.svc)
	return s
}

// ResetStats clears the counters.
func (m *Mapping) ResetStats() {
	m.mu.Lock()
	m.stats = MappingStats{}
	m.svc, m.svcN = m.svc[:0], 0
	m.mu.Unlock()
}

// Flush writes every dirty page back to the donor; the pages stay cached
// and become clean (write-protected again).
func (m *Mapping) Flush() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	var run []int
	for i := range m.pages {
		if m.resident[i] && m.dirty[i] {
			run = append(run, i)
		}
	}
	if err := m.writeBack(run); err != nil {
		return m.failLocked(err)
	}
	return nil
}

// Close flushes dirty pages, stops the fault handler and unmaps the memory.
// No goroutine may touch Bytes during or after Close.
func (m *Mapping) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	err := m.Flush()
	var one = [8]byte{1}
	_, _ = unix.Write(m.stop, one[:])
	<-m.done
	m.release()
	return err
}

func (m *Mapping) release() {
	if m.mem != nil {
		_ = m.u.Unregister(m.base, uintptr(len(m.mem)))
		_ = unix.Munmap(m.mem)
		m.mem = nil
	}
	if m.stage != nil {
		_ = unix.Munmap(m.stage)
		m.stage = nil
	}
	if m.stop >= 0 {
		_ = unix.Close(m.stop)
		m.stop = -1
	}
	if m.pg != nil {
		m.pg.close()
	}
	_ = m.u.Close()
}

func (m *Mapping) addr(i int) uintptr { return m.base + uintptr(i*m.ps) }

// LRU: head (next of sentinel) is most recent.
func (m *Mapping) lruRemove(i int) {
	p, n := m.prev[i], m.next[i]
	m.next[p], m.prev[n] = n, p
}

func (m *Mapping) lruPush(i int) {
	s := int32(m.pages)
	h := m.next[s]
	m.prev[i], m.next[i] = s, h
	m.prev[h] = int32(i)
	m.next[s] = int32(i)
}

func (m *Mapping) handler() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(m.done)
	buf := make([]byte, 64*uffd.MsgSize)
	msgs := make([]uffd.Msg, 0, 64)
	fds := make([]unix.PollFd, 2)
	for {
		fds[0] = unix.PollFd{Fd: int32(m.u.Fd()), Events: unix.POLLIN}
		fds[1] = unix.PollFd{Fd: int32(m.stop), Events: unix.POLLIN}
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			m.mu.Lock()
			_ = m.failLocked(fmt.Errorf("poll: %w", err))
			m.mu.Unlock()
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		var err error
		msgs, err = m.u.Read(buf, msgs[:0])
		if err != nil {
			m.mu.Lock()
			_ = m.failLocked(fmt.Errorf("read userfaultfd: %w", err))
			m.mu.Unlock()
			return
		}
		for _, msg := range msgs {
			if msg.Event != uffd.EventPagefault {
				continue
			}
			t0 := time.Now()
			m.mu.Lock()
			m.fault(msg, t0)
			m.mu.Unlock()
		}
	}
}

// fault serves one message; m.mu is held.
func (m *Mapping) fault(msg uffd.Msg, t0 time.Time) {
	i := int((uintptr(msg.Address) - m.base) / uintptr(m.ps))
	if i < 0 || i >= m.pages {
		return
	}
	if m.err != nil {
		_ = m.u.Wake(m.addr(i), uintptr(m.ps))
		return
	}
	if msg.Flags&uffd.FlagWP != 0 {
		if !m.resident[i] {
			_ = m.u.Wake(m.addr(i), uintptr(m.ps))
			return
		}
		m.stats.WPFaults++
		if m.probed[i] {
			m.probed[i] = false
			m.writeRate = 0.9*m.writeRate + 0.1
		}
		m.dirty[i] = true
		m.lruRemove(i)
		m.lruPush(i)
		if err := m.u.WriteProtect(m.addr(i), uintptr(m.ps), false, false); err != nil {
			_ = m.failLocked(fmt.Errorf("clear write protection: %w", err))
		}
		return
	}
	if m.resident[i] {
		_ = m.u.Wake(m.addr(i), uintptr(m.ps))
		return
	}
	// Readahead: sequential faults double the window, others reset it.
	if i == m.seqNext {
		m.raWin = min(m.raWin*2, m.maxRA)
	} else {
		m.raWin = 1
	}
	n := 1
	for n < m.raWin && i+n < m.pages && !m.resident[i+n] {
		n++
	}
	t1 := time.Now()
	if err := m.pg.read(m.stage[:n*m.ps], int64(i*m.ps)); err != nil {
		_ = m.failLocked(err)
		return
	}
	t2 := time.Now()
	m.stats.FetchTime += t2.Sub(t1)
	write := msg.Flags&uffd.FlagWrite != 0
	// When most faulted pages end up written (read-modify-write patterns),
	// install the faulting page writable and dirty at once, saving the
	// write-protect fault that would follow; every 8th such fault still
	// installs protected so the estimate keeps learning.
	m.faultSeq++
	if !write && m.writeRate > 0.5 && m.faultSeq%8 != 0 {
		write = true
		m.stats.PreDirtied++
	} else if !write {
		m.probed[i] = true
	}
	src := uintptr(unsafe.Pointer(&m.stage[0]))
	if err := m.install(i, src, 1, !write); err != nil {
		_ = m.failLocked(err)
		return
	}
	if n > 1 {
		if err := m.install(i+1, src+uintptr(m.ps), n-1, true); err != nil {
			_ = m.failLocked(err)
			return
		}
	}
	m.stats.InstallTime += time.Since(t2)
	m.dirty[i] = write
	for j := i; j < i+n; j++ {
		m.resident[j] = true
		m.lruPush(j)
	}
	m.nres += n
	m.seqNext = i + n
	m.stats.Faults++
	m.stats.PagesIn += int64(n)
	d := time.Since(t0)
	if len(m.svc) < cap(m.svc) {
		m.svc = append(m.svc, d)
	} else {
		m.svc[m.svcN%len(m.svc)] = d
		m.svcN++
	}
	// Evict after the faulting thread was woken, off its critical path: the
	// cache may exceed its size by one readahead window in between.
	t3 := time.Now()
	if err := m.makeRoom(0); err != nil {
		_ = m.failLocked(err)
	}
	m.stats.EvictTime += time.Since(t3)
}

func (m *Mapping) install(i int, src uintptr, n int, wp bool) error {
	for {
		_, err := m.u.Copy(m.addr(i), src, uintptr(n*m.ps), wp)
		if err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return fmt.Errorf("UFFDIO_COPY page %d: %w", i, err)
		}
		return nil
	}
}

// makeRoom evicts least recently used pages until n more fit.
func (m *Mapping) makeRoom(n int) error {
	if m.nres+n <= m.capPages {
		return nil
	}
	want := max(m.nres+n-m.capPages, m.batch)
	victims := make([]int, 0, want)
	s := int32(m.pages)
	for len(victims) < want && m.prev[s] != s {
		v := int(m.prev[s])
		m.lruRemove(v)
		victims = append(victims, v)
	}
	slices.Sort(victims)
	var dirty []int
	for _, v := range victims {
		if m.dirty[v] {
			dirty = append(dirty, v)
		}
		if m.probed[v] { // faulted by a read and never written
			m.probed[v] = false
			m.writeRate *= 0.9
		}
	}
	if err := m.writeBack(dirty); err != nil {
		return err
	}
	for k := 0; k < len(victims); {
		j := k + 1
		for j < len(victims) && victims[j] == victims[j-1]+1 {
			j++
		}
		lo, hi := victims[k], victims[j-1]+1
		if err := unix.Madvise(m.mem[lo*m.ps:hi*m.ps], unix.MADV_DONTNEED); err != nil {
			return fmt.Errorf("madvise dontneed: %w", err)
		}
		for v := lo; v < hi; v++ {
			m.resident[v] = false
		}
		k = j
	}
	m.nres -= len(victims)
	m.stats.Evictions += int64(len(victims))
	return nil
}

// writeBack write-protects the sorted dirty pages, sends them to the donor
// in runs of contiguous pages — pipelined, up to writeBackWindow requests
// before their acknowledgements are read — and marks them clean.
func (m *Mapping) writeBack(pages []int) error {
	maxRun := MaxPayload / m.ps
	type run struct{ lo, hi int }
	var runs []run
	for k := 0; k < len(pages); {
		j := k + 1
		for j < len(pages) && pages[j] == pages[j-1]+1 && j-k < maxRun {
			j++
		}
		runs = append(runs, run{pages[k], pages[j-1] + 1})
		k = j
	}
	for len(runs) > 0 {
		batch := runs[:min(len(runs), writeBackWindow)]
		runs = runs[len(batch):]
		hdrs := make([]byte, len(batch)*HeaderSize)
		bufs := make([][]byte, 0, 2*len(batch))
		first := m.pg.seq + 1
		for i, r := range batch {
			if err := m.u.WriteProtect(m.addr(r.lo), uintptr((r.hi-r.lo)*m.ps), true, false); err != nil {
				return fmt.Errorf("write-protect for write-back: %w", err)
			}
			data := m.mem[r.lo*m.ps : r.hi*m.ps]
			h := Header{Op: OpWrite, Seq: first + uint32(i), Offset: uint64(r.lo * m.ps), Length: uint32(len(data)), Payload: uint32(len(data))}
			hb := hdrs[i*HeaderSize : (i+1)*HeaderSize]
			h.Encode(hb)
			bufs = append(bufs, hb, data)
		}
		m.pg.seq += uint32(len(batch))
		if err := m.pg.sendv(bufs); err != nil {
			return err
		}
		var ack [HeaderSize]byte
		for i, r := range batch {
			if err := m.pg.reply(ack[:], first+uint32(i), OpWrite, nil); err != nil {
				return err
			}
			for v := r.lo; v < r.hi; v++ {
				m.dirty[v] = false
			}
			m.stats.WriteBacks += int64(r.hi - r.lo)
		}
	}
	return nil
}

// writeBackWindow bounds the write-back requests in flight, so their
// acknowledgements always fit in the socket's receive buffer.
const writeBackWindow = 128

// failLocked records a fatal error. The mapping is made inaccessible and
// every waiting thread woken, so touching it faults (SIGSEGV; a program can
// turn that into a panic with debug.SetPanicOnFault) instead of hanging.
func (m *Mapping) failLocked(err error) error {
	if m.err == nil {
		m.err = fmt.Errorf("%w: %w", ErrMappingFailed, err)
		if m.mem != nil {
			_ = unix.Mprotect(m.mem, unix.PROT_NONE)
			_ = m.u.Wake(m.base, uintptr(len(m.mem)))
		}
	}
	return m.err
}

// pager is a synchronous connection driven with raw syscalls, so the fault
// handler's thread never waits on the Go scheduler's netpoller. The socket is
// non-blocking: a receive first spins (re-trying the read) for up to spin,
// which keeps the round trip free of a sleep and wake-up when the donor
// answers quickly, then blocks in poll(2) for at most timeout.
type pager struct {
	f       *os.File
	fd      int
	seq     uint32
	hdr     [HeaderSize]byte
	iov     [2][]byte
	spin    time.Duration
	timeout time.Duration
}

func (c *Client) newPager(ctx context.Context) (*pager, error) {
	return c.newPagerKind(ctx, KindSync)
}

func (c *Client) newPagerKind(ctx context.Context, kind uint8) (*pager, error) {
	conn, _, err := c.handshake(ctx, kind)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return nil, fmt.Errorf("memory: mapping needs a TCP connection")
	}
	return newPagerTCP(tc, c.opts.Spin, c.opts.Timeout)
}

func newPagerTCP(tc *net.TCPConn, spin, timeout time.Duration) (*pager, error) {
	f, err := tc.File()
	if err != nil {
		return nil, fmt.Errorf("memory: pager fd: %w", err)
	}
	fd := int(f.Fd())
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("memory: pager fd: %w", err)
	}
	return &pager{f: f, fd: fd, spin: spin, timeout: timeout}, nil
}

// shutdown wakes any goroutine blocked on the socket; safe concurrently.
func (p *pager) shutdown() { _ = unix.Shutdown(p.fd, unix.SHUT_RDWR) }

func (p *pager) close() { _ = p.f.Close() }

// wait blocks until the socket is ready for events or the timeout passes.
func (p *pager) wait(events int16) error {
	ms := -1
	if p.timeout > 0 {
		ms = int(p.timeout.Milliseconds()) + 1
	}
	for {
		fds := [1]unix.PollFd{{Fd: int32(p.fd), Events: events}}
		n, err := unix.Poll(fds[:], ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: poll: %v", ErrDonorLost, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: no reply within %v", ErrDonorLost, p.timeout)
		}
		return nil
	}
}

func advance(bufs [][]byte, n int) [][]byte {
	for n > 0 && len(bufs) > 0 {
		if n >= len(bufs[0]) {
			n -= len(bufs[0])
			bufs = bufs[1:]
		} else {
			bufs[0] = bufs[0][n:]
			n = 0
		}
	}
	for len(bufs) > 0 && len(bufs[0]) == 0 {
		bufs = bufs[1:]
	}
	return bufs
}

func (p *pager) sendv(bufs [][]byte) error {
	for len(bufs) > 0 {
		n, err := unix.Writev(p.fd, bufs[:min(len(bufs), 1024)]) // IOV_MAX
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if err := p.wait(unix.POLLOUT); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: write: %v", ErrDonorLost, err)
		}
		bufs = advance(bufs, n)
	}
	return nil
}

func (p *pager) recvv(bufs [][]byte) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	_, err := p.recvAtLeast(bufs, total)
	return err
}

// recvAtLeast reads into bufs until at least least bytes arrived and returns
// how many did (at most the bufs' total length).
func (p *pager) recvAtLeast(bufs [][]byte, least int) (int, error) {
	if least <= 0 {
		return 0, nil
	}
	var t0 time.Time
	spins, got := 0, 0
	if p.spin == 0 {
		// A reply is rarely there yet: sleep in poll(2) first rather than
		// paying for a readv that returns EAGAIN.
		if err := p.wait(unix.POLLIN); err != nil {
			return 0, err
		}
	}
	for got < least {
		n, err := unix.Readv(p.fd, bufs)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if p.spin > 0 {
				if spins == 0 {
					t0 = time.Now()
				}
				spins++
				if spins&15 != 0 || time.Since(t0) < p.spin {
					continue
				}
			}
			if err := p.wait(unix.POLLIN); err != nil {
				return got, err
			}
			continue
		}
		if err != nil {
			return got, fmt.Errorf("%w: read: %v", ErrDonorLost, err)
		}
		if n == 0 {
			return got, fmt.Errorf("%w: read: EOF", ErrDonorLost)
		}
		got += n
		bufs = advance(bufs, n)
	}
	return got, nil
}

func (p *pager) do(op uint8, buf []byte, off int64) error {
	p.seq++
	h := Header{Op: op, Seq: p.seq, Offset: uint64(off), Length: uint32(len(buf))}
	bufs := append(p.iov[:0], p.hdr[:])
	if op == OpWrite {
		h.Payload = h.Length
		bufs = append(bufs, buf)
	}
	h.Encode(p.hdr[:])
	if err := p.sendv(bufs); err != nil {
		return err
	}
	return p.reply(p.hdr[:], p.seq, op, buf)
}

// reply receives the reply to request seq: one readv for the header and, for
// reads, the data behind it (into buf, whose length is the request's).
func (p *pager) reply(hdr []byte, seq uint32, op uint8, buf []byte) error {
	var in [][]byte
	if op == OpRead {
		in = [][]byte{hdr[:HeaderSize], buf}
	} else {
		in = [][]byte{hdr[:HeaderSize]}
	}
	got, err := p.recvAtLeast(in, HeaderSize)
	if err != nil {
		return err
	}
	rh, err := DecodeHeader(hdr[:HeaderSize])
	if err != nil {
		return err
	}
	if rh.Seq != seq || rh.Op != op || !rh.IsResponse() {
		return fmt.Errorf("%w: reply seq %d op %d for seq %d op %d", ErrBadFrame, rh.Seq, rh.Op, seq, op)
	}
	extra := got - HeaderSize // payload bytes already in buf
	if rh.Status != StatusOK {
		msg := make([]byte, rh.Payload)
		k := copy(msg, buf[:min(extra, len(buf))])
		if err := p.recvv([][]byte{msg[k:]}); err != nil {
			return err
		}
		return statusError(rh.Status, msg)
	}
	if op == OpRead {
		if int(rh.Length) != len(buf) {
			return fmt.Errorf("%w: read reply of %d bytes for %d", ErrBadFrame, rh.Length, len(buf))
		}
		return p.recvv([][]byte{buf[extra:]})
	}
	return nil
}

func (p *pager) read(buf []byte, off int64) error { return p.do(OpRead, buf, off) }
