package mapping

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/rialto-project/rialto/internal/childenv"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
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

// Session is the memory session a mapping rides on: a *client.Client, or
// a *client.Following, which follows its region when the lease moves.
type Session interface {
	Size() int64
	Timeout() time.Duration
	// Join opens one more connection of the session (the mapping's
	// fault connection, of kind protocol.KindFault).
	Join(ctx context.Context, kind uint8) (net.Conn, error)
}

// tlsSession is a Session that may run over TLS (client.Client,
// client.Following): its fault connection is then handed to the handler
// as a bare connection and a handoff (DialHandoff), not joined.
type tlsSession interface {
	TLS() bool
	DialHandoff(ctx context.Context, kind uint8) (net.Conn, client.Handoff, error)
}

// Follower is a Session that follows its region when the lease moves to
// another donor (client.Following). A mapping on one follows too: when
// its fault connection ends — the old donor retired the region, answering
// GONE and closing the session's connections, or a request on it timed
// out — the handler asks the program for a new one (Rejoin: the session
// at the region's new place, or the same session, where the new
// connection names the old one, which the donor ends first) and serves
// the faults and write-backs that were under way there, so that no touch
// of the mapping fails. JoinReplacing opens the first one (old: none),
// telling its client.ConnRef.
type Follower interface {
	Session
	JoinReplacing(ctx context.Context, kind uint8, old client.ConnRef) (net.Conn, client.ConnRef, error)
	Rejoin(ctx context.Context, kind uint8, old client.ConnRef) (net.Conn, client.ConnRef, error)
}

// tlsFollower is a Follower whose session may run over TLS
// (client.Following): over TLS the handler gets its new connection as it
// got its first, a bare connection and a handoff (RejoinHandoff: the
// session at the region's new place verified the new donor's certificate
// against the CA, and the handoff pins that key; on the same session the
// handoff names the old connection, Handoff.Replaces).
type tlsFollower interface {
	Follower
	RejoinHandoff(ctx context.Context, kind uint8, old client.ConnRef) (net.Conn, client.Handoff, error)
}

// followWait bounds how long a mapping's handler waits for a new fault
// connection when its region moved.
const followWait = 30 * time.Second

// Options tune a Mapping. The zero value maps the whole region with a
// cache of 10% of it.
type Options struct {
	// CacheBytes is the local cache size. Default: 10% of the mapped
	// length, at least 16 pages.
	CacheBytes int64
	// Readahead is the largest number of pages fetched for one fault when
	// faults are sequential (the window doubles from 1 on each sequential
	// fault). Default 64 (256 KiB); 1 disables readahead.
	Readahead int
	// EvictBatch bounds how far the cache may outgrow CacheBytes while
	// faults come back to back: the handler evicts a few pages at a time
	// whenever no fault is waiting, and EvictBatch pages at once (dirty
	// neighbours written back in one request) only when the cache is that
	// much over its size. Default 32.
	EvictBatch int
	// Spin is how long the fault handler busy-polls, between faults, for
	// the next fault and, during a fault, for the donor's reply before
	// sleeping (it costs the handler process up to one CPU while faults
	// keep coming). Zero means DefaultSpin; negative disables it.
	Spin time.Duration
	// HandlerPath is the binary run as the fault handler process; empty
	// means this program's own (/proc/self/exe), which must call
	// RunFaultHandlerIfChild first in main or TestMain.
	HandlerPath string
}

// DefaultSpin is the fault handler's default busy-poll budget.
const DefaultSpin = 50 * time.Microsecond

// Stats counts what a Mapping did.
type Stats struct {
	Faults     int64 // missing-page faults served
	WPFaults   int64 // first writes to clean pages
	PreDirtied int64 // read faults installed writable because writes were likely
	PagesIn    int64 // pages fetched (including readahead)
	// Batched counts the missing-page faults, among Faults, that arrived
	// together from threads faulting concurrently and were fetched with
	// their READs sent together.
	Batched    int64
	Evictions  int64 // pages evicted
	Punches    int64 // holes punched to evict them (one per run of contiguous pages)
	WriteBacks int64 // dirty pages written back
	// FaultWriteBacks counts the write-backs sent behind a fault's READ
	// (evicting while the page travels) among WriteBacks.
	FaultWriteBacks int64
	// Follows counts the new donor connections the handler took after
	// its connection ended (the region moved: see Follower).
	Follows     int64
	FetchTime   time.Duration // total time waiting for the donor's pages
	InstallTime time.Duration // total time in UFFDIO_COPY
	EvictTime   time.Duration // total time evicting (write-back included)
	HandlerCPU  time.Duration // CPU time (user+system) the handler process used so far
	Resident    int           // pages in the cache now
	CachePages  int
	ServiceTime []time.Duration // per missing fault, from the handler reading it to waking its thread (last 64Ki)
}

// Mapping is a transparent view of a remote region: Bytes returns ordinary
// memory whose pages are fetched from the donor on first touch.
//
// Design: the region is a memfd mapped shared and registered with
// userfaultfd in missing and write-protect modes. Faults are served by a
// separate handler process (this program re-executed, see
// RunFaultHandlerIfChild), which inherits the userfaultfd, the memfd, and
// the mapping's own connection to the donor: UFFDIO_COPY, WRITEPROTECT and
// WAKE on the inherited descriptor act on this process's memory, and the
// handler reads dirty pages for write-back through its own mapping of the
// memfd. Because no thread of this process takes part in serving a fault,
// a garbage collection that stops the world while a goroutine waits on a
// fault (even inside non-preemptible runtime code) simply waits for the
// handler like any other page fault would.
//
// The handler installs pages write-protected, so the first write to a page
// raises a WP fault that marks it dirty and lifts the protection; clean
// pages are never written back. When the cache is full the least recently
// faulted pages (recency is updated on fault-in and on first write: the
// handler cannot see plain loads of resident pages) are evicted: dirty ones
// are write-protected and written back, then every victim is punched out of
// the memfd, so that its next touch faults again. Sequential faults grow a
// readahead window. When most read-faulted pages end up written
// (read-modify-write), read faults install the page writable and dirty
// directly, saving the second fault. This process talks to the handler over
// a unix socket only for Flush, Stats, Err and Close.
type Mapping struct {
	mem   []byte
	base  uintptr
	u     *uffd.FD
	memfd int
	cmd   *exec.Cmd
	ctrl  net.Conn

	s   Session
	tls bool // the session runs over TLS: connections go with a handoff

	cmdMu   sync.Mutex // one command at a time
	wmu     sync.Mutex // one frame written to the control socket at a time
	replies chan ctlFrame
	exited  chan struct{} // closed when the control socket ends
	follows sync.WaitGroup
	closing chan struct{} // closed by release: follows under way give up

	mu     sync.Mutex
	err    error // the mapping's failure, once known here
	closed bool
}

type ctlFrame struct {
	op      uint8
	payload []byte
}

// errHandlerGone reports that the handler process ended unexpectedly.
var errHandlerGone = errors.New("memory: fault handler process ended")

// Map maps the session's whole region (rounded down to pages) over its
// own connection of the session, served by a fault handler process; on a
// Follower (client.Following) the mapping follows the region when it
// moves. It returns an error wrapping ErrUffdUnavailable when userfaultfd
// is refused. Close the Mapping before the session.
func Map(ctx context.Context, c Session, opts Options) (*Mapping, error) {
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
	opts.Readahead = min(opts.Readahead, protocol.MaxPayload/ps, capPages/2)
	if opts.EvictBatch <= 0 {
		opts.EvictBatch = 32
	}
	if opts.Spin == 0 {
		opts.Spin = DefaultSpin
	}
	exe := opts.HandlerPath
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("memory: fault handler binary: %w", err)
		}
	}
	const need = uffd.FeaturePagefaultFlagWP | uffd.FeatureMissingShmem | uffd.FeatureWPShmem
	u, err := openUffd(need | uffd.FeaturePoison)
	if err != nil {
		u, err = openUffd(need)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUffdUnavailable, err)
	}
	m := &Mapping{u: u, memfd: -1, s: c, replies: make(chan ctlFrame, 1), exited: make(chan struct{}), closing: make(chan struct{})}
	f, follow := c.(Follower)
	ts, overTLS := c.(tlsSession)
	overTLS = overTLS && ts.TLS()
	if overTLS {
		_, follow = c.(tlsFollower)
	}
	m.tls = overTLS
	ok := false
	defer func() {
		if !ok {
			m.release()
		}
	}()
	if m.memfd, err = unix.MemfdCreate("rialto-mapping", unix.MFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("memory: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(m.memfd, size); err != nil {
		return nil, fmt.Errorf("memory: size memfd: %w", err)
	}
	if m.mem, err = unix.Mmap(m.memfd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("memory: mmap %d bytes: %w", size, err)
	}
	m.base = uintptr(unsafe.Pointer(&m.mem[0]))
	if err := u.Register(m.base, uintptr(size), uffd.ModeMissing|uffd.ModeWP); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUffdUnavailable, err)
	}
	hcfg := handlerConfig{Base: uint64(m.base), Pages: pages, PageSize: ps, CapPages: capPages,
		MaxRA: max(opts.Readahead, 1), Batch: min(opts.EvictBatch, capPages/2), Spin: opts.Spin,
		Timeout: c.Timeout(), Features: u.Features, TLS: overTLS, Follow: follow}
	// Over TLS the handler runs the session's connection itself (a TLS
	// session cannot cross processes): it gets the bare TCP connection and,
	// on the control socket, the handoff. A follower's handler names its
	// connection when it asks for a new one (ctlReopen).
	var conn net.Conn
	var handoff []byte
	switch {
	case overTLS:
		var h client.Handoff
		if conn, h, err = ts.DialHandoff(ctx, protocol.KindFault); err != nil {
			return nil, err
		}
		if handoff, err = json.Marshal(h); err != nil {
			conn.Close()
			return nil, err
		}
	case follow:
		if conn, hcfg.Conn, err = f.JoinReplacing(ctx, protocol.KindFault, client.ConnRef{}); err != nil {
			return nil, err
		}
	default:
		if conn, err = c.Join(ctx, protocol.KindFault); err != nil {
			return nil, err
		}
	}
	donor, err := connFile(conn)
	_ = conn.Close()
	if err != nil {
		return nil, err
	}
	cfg, err := json.Marshal(hcfg)
	if err != nil {
		_ = donor.Close()
		return nil, err
	}
	passed := []*os.File{donor}
	defer func() { // the child has its copies once started
		for _, f := range passed {
			_ = f.Close()
		}
	}()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("memory: socketpair: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(sp[0]), "handler-control"), os.NewFile(uintptr(sp[1]), "handler-control")
	passed = append(passed, theirs)
	m.ctrl, err = net.FileConn(mine)
	_ = mine.Close()
	if err != nil {
		return nil, fmt.Errorf("memory: control socket: %w", err)
	}
	if handoff != nil {
		// The socket buffer holds it until the handler reads it.
		if _, err := m.ctrl.Write(handoffFrame(handoff)); err != nil {
			return nil, fmt.Errorf("memory: control socket: %w", err)
		}
	}
	ufile, err := dupFile(u.Fd(), "userfaultfd")
	if err != nil {
		return nil, err
	}
	passed = append(passed, ufile)
	mfile, err := dupFile(m.memfd, "memfd")
	if err != nil {
		return nil, err
	}
	passed = append(passed, mfile)
	// The order of ExtraFiles gives the handler's descriptors 3, 4, 5, 6.
	// The handler gets a process group of its own: an interrupt from the
	// terminal (Ctrl-C goes to the foreground group) is the program's to
	// handle, and a program that shuts down gracefully still needs its
	// mapping meanwhile. The handler exits when the program goes.
	m.cmd = &exec.Cmd{Path: exe, Args: []string{HandlerArg}, Stderr: os.Stderr,
		Env:         childenv.Environ(HandlerEnv + "=" + string(cfg)),
		ExtraFiles:  []*os.File{ufile, mfile, donor, theirs},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	if err := m.cmd.Start(); err != nil {
		m.cmd = nil
		return nil, fmt.Errorf("memory: start fault handler %s: %w", exe, err)
	}
	for _, f := range passed {
		_ = f.Close()
	}
	passed = nil
	go m.watch()
	// The handler's first frame says it is serving; a binary that does not
	// call RunFaultHandlerIfChild never sends it.
	t := time.NewTimer(handlerStartLimit)
	defer t.Stop()
	select {
	case f := <-m.replies:
		if f.op == ctlStartFailed {
			return nil, fmt.Errorf("memory: fault handler: %s", f.payload)
		}
		if f.op != ctlReady {
			return nil, fmt.Errorf("memory: fault handler %s: unexpected first frame %d", exe, f.op)
		}
	case <-m.exited:
		return nil, fmt.Errorf("memory: fault handler %s ended before serving (does its main call mapping.RunFaultHandlerIfChild?)", exe)
	case <-t.C:
		_ = m.cmd.Process.Kill()
		return nil, fmt.Errorf("memory: fault handler %s not ready within %v (does its main call mapping.RunFaultHandlerIfChild?)", exe, handlerStartLimit)
	case <-ctx.Done():
		_ = m.cmd.Process.Kill()
		return nil, ctx.Err()
	}
	ok = true
	return m, nil
}

// handoffFrame is the ctlHandoff frame carrying handoff (client.Handoff
// as JSON).
func handoffFrame(handoff []byte) []byte {
	var hdr [ctlHeader]byte
	hdr[0] = ctlHandoff
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(handoff)))
	return append(hdr[:], handoff...)
}

// handlerStartLimit bounds the wait for a fault handler process to start.
const handlerStartLimit = 10 * time.Second

// connFile returns a duplicate of a TCP connection's descriptor.
func connFile(conn net.Conn) (*os.File, error) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return nil, fmt.Errorf("memory: mapping needs a TCP connection")
	}
	f, err := tc.File()
	if err != nil {
		return nil, fmt.Errorf("memory: donor connection descriptor: %w", err)
	}
	return f, nil
}

func dupFile(fd int, name string) (*os.File, error) {
	d, err := unix.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("memory: dup %s: %w", name, err)
	}
	unix.CloseOnExec(d)
	return os.NewFile(uintptr(d), name), nil
}

// maxCtlPayload bounds a control frame from the handler (the largest, a
// stats reply with 65,536 service times as JSON, is about 1.3 MB).
const maxCtlPayload = 16 << 20

// watch reads the handler's frames: replies go to the waiting command, an
// unasked failure report (or the handler's end) makes the region
// inaccessible and wakes every waiting thread, so that touches fault
// instead of hanging (the handler itself poisons the pages it refuses; this
// also covers kernels without UFFDIO_POISON and a handler that died).
func (m *Mapping) watch() {
	defer close(m.exited)
	r := bufio.NewReader(m.ctrl)
	for {
		var hdr [ctlHeader]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			m.mu.Lock()
			if !m.closed {
				m.failLocked(errHandlerGone)
			}
			m.mu.Unlock()
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > maxCtlPayload { // not our handler's frame: stop listening to it
			m.mu.Lock()
			m.failLocked(fmt.Errorf("%w: fault handler sent a %d-byte control frame", protocol.ErrBadFrame, n))
			m.mu.Unlock()
			_ = m.ctrl.Close()
			return
		}
		f := ctlFrame{op: hdr[0], payload: make([]byte, n)}
		if _, err := io.ReadFull(r, f.payload); err != nil {
			continue // the next read reports the end
		}
		if f.op == ctlFailed {
			m.mu.Lock()
			m.failLocked(decodeErr(f.payload))
			m.mu.Unlock()
			continue
		}
		if f.op == ctlReopen {
			// The fault connection ended: the region may have moved. The
			// handler waits for a new one (followWait).
			old, _ := readRef(f.payload)
			m.follows.Add(1)
			go func() {
				defer m.follows.Done()
				m.reopen(old)
			}()
			continue
		}
		m.replies <- f
	}
}

// failLocked records err and makes the region inaccessible; m.mu is held.
func (m *Mapping) failLocked(err error) {
	if m.err != nil || err == nil {
		return
	}
	m.err = err
	if m.mem != nil {
		_ = unix.Mprotect(m.mem, unix.PROT_NONE)
		_ = m.u.Wake(m.base, uintptr(len(m.mem)))
	}
}

// remoteError is an error reported by the handler process.
type remoteError struct {
	msg  string
	lost bool
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Is(target error) bool {
	return target == ErrMappingFailed || (e.lost && target == protocol.ErrDonorLost)
}

func decodeErr(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	return &remoteError{msg: string(p[1:]), lost: p[0] == 1}
}

// reopen answers the handler's ctlReopen for its connection old: a new
// fault connection, of the session where the region is now
// (Follower.Rejoin; on old's session it names old, which the donor ends
// first), passed with ctlConn and its ConnRef; or why there is none,
// which fails the mapping. Over TLS the connection is a bare one to the
// region's new donor (tlsFollower.RejoinHandoff), and a ctlHandoff frame
// (naming old on old's session) goes right before the ctlConn, as before
// the handler started: the handler runs the TLS session and the HELLO
// itself.
func (m *Mapping) reopen(old client.ConnRef) {
	var file *os.File
	var handoff []byte
	var ref client.ConnRef
	err := errors.New("memory: the mapping's session does not follow its region")
	if f, ok := m.s.(Follower); ok {
		ctx, cancel := context.WithTimeout(context.Background(), followWait)
		done := make(chan struct{})
		go func() {
			select {
			case <-m.closing:
				cancel()
			case <-done:
			}
		}()
		defer close(done)
		var conn net.Conn
		if tf, ok := f.(tlsFollower); m.tls && ok {
			var h client.Handoff
			if conn, h, err = tf.RejoinHandoff(ctx, protocol.KindFault, old); err == nil {
				if handoff, err = json.Marshal(h); err != nil {
					_ = conn.Close()
				}
			}
		} else if m.tls {
			err = errors.New("memory: the mapping's session does not follow its region over TLS")
		} else {
			conn, ref, err = f.Rejoin(ctx, protocol.KindFault, old)
		}
		if err == nil {
			file, err = connFile(conn)
			_ = conn.Close()
		}
		cancel()
	}
	var hdr [ctlHeader]byte
	hdr[0] = ctlConn
	m.wmu.Lock()
	defer m.wmu.Unlock()
	if err != nil {
		msg := append([]byte{connFailed}, err.Error()...)
		binary.BigEndian.PutUint32(hdr[1:], uint32(len(msg)))
		_, _ = m.ctrl.Write(append(hdr[:], msg...))
		return
	}
	defer file.Close()
	uc, ok := m.ctrl.(*net.UnixConn)
	if !ok {
		return
	}
	// One message: the handoff (over TLS), then the ctlConn frame with
	// the connection's ConnRef (over TLS the handler's HELLO tells it),
	// the descriptor attached.
	var msg []byte
	if handoff != nil {
		msg = handoffFrame(handoff)
	}
	payload := appendRef([]byte{connOK}, ref)
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	msg = append(append(msg, hdr[:]...), payload...)
	n, _, err := uc.WriteMsgUnix(msg, unix.UnixRights(int(file.Fd())), nil)
	if err == nil && n < len(msg) { // a stream socket may take part of it
		_, _ = m.ctrl.Write(msg[n:])
	}
}

// call sends a command to the handler and returns its reply.
func (m *Mapping) call(op uint8) ([]byte, error) {
	m.cmdMu.Lock()
	defer m.cmdMu.Unlock()
	var hdr [ctlHeader]byte
	hdr[0] = op
	m.wmu.Lock()
	_, err := m.ctrl.Write(hdr[:])
	m.wmu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMappingFailed, errHandlerGone)
	}
	var f ctlFrame
	select {
	case f = <-m.replies:
	case <-m.exited:
		// watch queues a reply before it sees the end of the socket (the
		// handler exits right after answering ctlClose).
		select {
		case f = <-m.replies:
		default:
			return nil, fmt.Errorf("%w: %w", ErrMappingFailed, errHandlerGone)
		}
	}
	if f.op != op {
		return nil, fmt.Errorf("%w: handler replied %d to %d", ErrMappingFailed, f.op, op)
	}
	return f.payload, nil
}

// Bytes is the mapped region. It stays valid until Close; do not touch it
// during or after Close.
func (m *Mapping) Bytes() []byte { return m.mem }

// Err reports why the mapping failed, if it did (asking the handler).
func (m *Mapping) Err() error {
	m.mu.Lock()
	err, closed := m.err, m.closed
	m.mu.Unlock()
	if err != nil || closed {
		return err
	}
	p, err := m.call(ctlErr)
	if err != nil {
		return err
	}
	return decodeErr(p)
}

// Stats returns counters and the recent fault service times.
func (m *Mapping) Stats() Stats {
	var s Stats
	if p, err := m.call(ctlStats); err == nil {
		_ = json.Unmarshal(p, &s)
	}
	return s
}

// ResetStats clears the counters.
func (m *Mapping) ResetStats() { _, _ = m.call(ctlReset) }

// Flush writes every dirty page back to the donor; the pages stay cached
// and become clean (write-protected again).
func (m *Mapping) Flush() error {
	p, err := m.call(ctlFlush)
	if err != nil {
		return err
	}
	return decodeErr(p)
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
	prev := m.err
	m.mu.Unlock()
	p, err := m.call(ctlClose)
	if err == nil {
		err = decodeErr(p)
	}
	if err == nil {
		err = prev
	}
	m.release()
	return err
}

func (m *Mapping) release() {
	close(m.closing)
	if m.ctrl != nil {
		_ = m.ctrl.Close()
	}
	if m.cmd != nil {
		_ = m.cmd.Wait() // it exits on ctlClose or when its socket ends
		<-m.exited
		m.cmd = nil
	}
	m.follows.Wait()
	if m.mem != nil {
		_ = m.u.Unregister(m.base, uintptr(len(m.mem)))
		_ = unix.Munmap(m.mem)
		m.mem = nil
	}
	if m.memfd >= 0 {
		_ = unix.Close(m.memfd)
		m.memfd = -1
	}
	_ = m.u.Close()
}
