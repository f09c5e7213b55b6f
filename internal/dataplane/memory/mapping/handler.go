package mapping

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/internal/rawconn"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/dataplane/memory/uffd"
	"golang.org/x/sys/unix"
)

// HandlerEnv marks a process as a Mapping's fault handler: Map re-executes
// the program's own binary (/proc/self/exe, argument HandlerArg) with this
// variable set to the handler's configuration. See RunFaultHandlerIfChild.
const HandlerEnv = "RIALTO_MEMORY_FAULT_HANDLER"

// HandlerArg is the first argument of a fault handler process (what ps
// shows; the rialto binary's hidden subcommand).
const HandlerArg = "memory-fault-handler"

// Descriptors a handler process inherits (exec.Cmd.ExtraFiles order).
const (
	handlerFdUffd  = 3 // the userfaultfd, registered by the parent
	handlerFdMem   = 4 // the memfd backing the mapped region
	handlerFdDonor = 5 // the KindFault connection to the donor
	handlerFdCtrl  = 6 // unix socket to the parent (commands, replies)
)

// RunFaultHandlerIfChild turns the process into a Mapping's fault handler
// when Map started it (HandlerEnv is set): it serves page faults until the
// mapping closes or its owner dies, then exits the process. Otherwise it
// returns at once. Every program that calls Map must call it first thing in
// main (the rialto binary does) and in TestMain (the re-exec pattern).
func RunFaultHandlerIfChild() {
	cfg := os.Getenv(HandlerEnv)
	if cfg == "" {
		return
	}
	if err := runFaultHandler(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "rialto %s: %v\n", HandlerArg, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// handlerConfig is what Map tells its handler process (JSON in HandlerEnv).
type handlerConfig struct {
	Base     uint64        // address of the region in the parent
	Pages    int           // region length in pages
	PageSize int           //
	CapPages int           // local cache size in pages
	MaxRA    int           // largest readahead window in pages
	Batch    int           // pages evicted together
	Spin     time.Duration // busy-poll budget on the userfaultfd and the donor
	Timeout  time.Duration // donor reply timeout
	Features uint64        // negotiated userfaultfd features
	// TLS: the session runs over TLS, and the donor connection is a bare
	// TCP connection the handler completes itself (TLS, then HELLO) from
	// the handoff the parent writes first on the control socket: the
	// credential never goes in the environment. So is every connection
	// that follows the region: a ctlHandoff frame comes right before its
	// ctlConn.
	TLS    bool
	Follow bool // the session follows its region: ask for a new connection when it ends
	// Conn names the donor connection (over TLS the handler learns it
	// from its own HELLO): a new connection that replaces it names it
	// (client.ConnRef, ctlReopen).
	Conn client.ConnRef
}

// Control protocol between a Mapping and its handler over a unix stream
// socket: frames of [op u8][length u32 big-endian][payload]. The parent
// sends one command at a time and waits for the reply with the same op;
// error payloads are [donor-lost flag u8][message].
const (
	ctlFlush uint8 = 1 + iota // write back dirty pages; reply: error
	ctlStats                  // reply: Stats as JSON
	ctlReset                  // clear counters; reply: empty
	ctlErr                    // reply: error
	ctlClose                  // flush and exit; reply: error
	// ctlConn (parent → handler, unasked, the answer to ctlReopen): a new
	// donor connection, its descriptor passed with the frame (SCM_RIGHTS),
	// payload connOK and its client.ConnRef (refSize bytes: session u64,
	// id u32; none over TLS, where the handler's own HELLO tells it); or
	// connFailed and why there is none.
	ctlConn
	// ctlHandoff (parent → handler): client.Handoff as JSON, for a session
	// over TLS: before the handler starts (for its first connection), and
	// right before each ctlConn that brings a connection (the region's new
	// place: the handoff names that donor's key).
	ctlHandoff

	ctlFailed uint8 = 0x80 // handler → parent, unasked: the mapping failed
	ctlReady  uint8 = 0x81 // handler → parent, first frame: serving faults
	// ctlReopen (handler → parent, unasked): the donor connection ended
	// or was given up (payload: its client.ConnRef, refSize bytes, then
	// the error); the region may have moved: send a new one, which names
	// it if it is of the same session (the donor ends it first: nothing
	// of a write-back given up on it lands after the ones sent again).
	ctlReopen      uint8 = 0x82
	ctlStartFailed uint8 = 0x83 // handler → parent, first frame instead of ctlReady: why it cannot serve
)

const ctlHeader = 5

// A ctlConn frame's payload starts with connOK or connFailed.
const (
	connOK uint8 = iota
	connFailed
)

// refSize is the size of a client.ConnRef in a control frame.
const refSize = 12

// appendRef appends r to b (session u64, id u32, big-endian).
func appendRef(b []byte, r client.ConnRef) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Session)
	return binary.BigEndian.AppendUint32(b, r.ID)
}

// readRef reads a client.ConnRef at the start of b (the zero one if b is
// shorter) and returns the rest.
func readRef(b []byte) (client.ConnRef, []byte) {
	if len(b) < refSize {
		return client.ConnRef{}, nil
	}
	return client.ConnRef{Session: binary.BigEndian.Uint64(b), ID: binary.BigEndian.Uint32(b[8:])}, b[refSize:]
}

// faultHandler is the state of a handler process. Nothing in it waits for
// the parent: the control socket is non-blocking both ways, so a parent
// whose threads are all stopped (a garbage collection waiting for a
// faulting thread) never stalls the service of that thread's fault.
type faultHandler struct {
	cfg   handlerConfig
	u     *uffd.FD
	memfd int
	mem   []byte // the region, mapped shared here (read for write-back)
	ctrl  int
	pg    *rawconn.Conn
	conn  client.ConnRef            // pg's connection in its session (ctlReopen names it)
	rhdr  [protocol.HeaderSize]byte // reply headers of fault READs
	stage []byte                    // staging buffer for UFFDIO_COPY

	base  uintptr
	ps    int
	pages int

	resident []bool
	dirty    []bool
	// probedAt marks pages installed write-protected by a read fault and
	// not yet written (the faultSeq of that fault; 0: not probed). Their
	// fate feeds writeRate, the moving estimate of how often a faulted
	// page gets written: a write-protect fault counts as written; eviction,
	// or probeHorizon later probes without a write, as not. The horizon
	// keeps the estimate about recent faults: judged only at eviction, a
	// full cache would make it lag a change of access pattern by a whole
	// cache's worth of faults.
	probedAt   []uint64
	probes     [probeHorizon]probe // ring of the latest probes
	nprobes    uint64
	writeRate  float64
	faultSeq   uint64
	prev       []int32 // LRU links; index pages is the sentinel
	next       []int32
	nres       int
	raWin      int
	seqNext    int
	victims    []int
	dirtyBuf   []int
	batch      []uffd.Msg // faults served together by faultBatch
	batchPages []int
	batchHdrs  [maxBatch * protocol.HeaderSize]byte
	stats      Stats
	svc        []time.Duration
	svcN       int
	err        error

	in, out []byte // control socket buffers
	fds     []int  // descriptors received on the control socket, not taken yet
	// handoff is the last ctlHandoff frame received while following over
	// TLS: how to complete the connection the next ctlConn brings.
	handoff *client.Handoff
	closing bool
}

func runFaultHandler(cfgText string) error {
	var cfg handlerConfig
	if err := json.Unmarshal([]byte(cfgText), &cfg); err != nil {
		return fmt.Errorf("bad %s: %w", HandlerEnv, err)
	}
	if cfg.Pages <= 0 || cfg.PageSize <= 0 {
		return fmt.Errorf("bad %s: %d pages of %d bytes", HandlerEnv, cfg.Pages, cfg.PageSize)
	}
	// The loop allocates little; a collection here pauses only this process.
	runtime.LockOSThread()
	var handoff *client.Handoff
	if cfg.TLS {
		var err error
		if handoff, err = readHandoff(handlerFdCtrl); err != nil {
			return startFailed(err)
		}
	}
	h := &faultHandler{cfg: cfg, u: uffd.FromFd(handlerFdUffd, cfg.Features), memfd: handlerFdMem,
		ctrl: handlerFdCtrl, base: uintptr(cfg.Base), ps: cfg.PageSize, pages: cfg.Pages,
		resident: make([]bool, cfg.Pages), dirty: make([]bool, cfg.Pages), probedAt: make([]uint64, cfg.Pages),
		prev: make([]int32, cfg.Pages+1), next: make([]int32, cfg.Pages+1), raWin: 1, seqNext: -1,
		svc: make([]time.Duration, 0, 1<<16), conn: cfg.Conn}
	h.prev[h.pages], h.next[h.pages] = int32(h.pages), int32(h.pages)
	for _, fd := range []int{handlerFdUffd, handlerFdDonor, handlerFdCtrl} {
		if err := unix.SetNonblock(fd, true); err != nil {
			return fmt.Errorf("descriptor %d: %w", fd, err)
		}
	}
	var err error
	if h.mem, err = unix.Mmap(h.memfd, 0, h.pages*h.ps, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("map region: %w", err)
	}
	if h.stage, err = unix.Mmap(-1, 0, max(cfg.MaxRA, maxBatch)*h.ps, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("map staging buffer: %w", err)
	}
	// The donor connection stays a bare descriptor: an os.File of a
	// non-blocking socket would register it with the netpoller (see rawconn).
	h.pg = rawconn.New(handlerFdDonor, max(cfg.Spin, 0), cfg.Timeout)
	if handoff != nil {
		if err := h.pg.StartTLS(handoff.TLSConfig(), false); err != nil {
			return startFailed(err)
		}
		id, err := client.Hello(h.pg, handoff.Hello, handoff.Replaces)
		if err != nil {
			return startFailed(err)
		}
		h.conn = client.ConnRef{Session: handoff.Hello.Session, ID: id}
	}
	h.reply(ctlReady, nil)
	return h.loop()
}

// readHandoff reads the parent's ctlHandoff frame from the control socket
// (waiting for it: the handler serves nothing before it).
func readHandoff(fd int) (*client.Handoff, error) {
	read := func(b []byte) error {
		for len(b) > 0 {
			n, err := unix.Read(fd, b)
			if err == unix.EINTR {
				continue
			}
			if err == unix.EAGAIN {
				fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				_, _ = unix.Poll(fds[:], int(handlerStartLimit.Milliseconds()))
				continue
			}
			if err != nil {
				return fmt.Errorf("read the handoff: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("read the handoff: %w", io.ErrUnexpectedEOF)
			}
			b = b[n:]
		}
		return nil
	}
	var hdr [ctlHeader]byte
	if err := read(hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if hdr[0] != ctlHandoff || n > 64<<10 {
		return nil, fmt.Errorf("expected the handoff, got frame %d of %d bytes", hdr[0], n)
	}
	b := make([]byte, n)
	if err := read(b); err != nil {
		return nil, err
	}
	var h client.Handoff
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("bad handoff: %w", err)
	}
	return &h, nil
}

// startFailed tells the parent why the handler cannot serve (its first
// frame) and returns err.
func startFailed(err error) error {
	msg := err.Error()
	var hdr [ctlHeader]byte
	hdr[0] = ctlStartFailed
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(msg)))
	b := append(hdr[:], msg...)
	for len(b) > 0 {
		n, werr := unix.Write(handlerFdCtrl, b)
		if werr == unix.EINTR || werr == unix.EAGAIN {
			fds := [1]unix.PollFd{{Fd: handlerFdCtrl, Events: unix.POLLOUT}}
			_, _ = unix.Poll(fds[:], 1000)
			continue
		}
		if werr != nil {
			break
		}
		b = b[n:]
	}
	return err
}

// loop serves faults and commands until ctlClose or the parent's end.
// Between faults it keeps reading the userfaultfd without blocking for up to
// cfg.Spin (checking the control socket every few rounds), then sleeps in
// poll(2) on both.
func (h *faultHandler) loop() error {
	buf := make([]byte, 64*uffd.MsgSize)
	msgs := make([]uffd.Msg, 0, 64)
	var fds [2]unix.PollFd
	var idle time.Time
	spins := 0
	for {
		var err error
		msgs, err = h.u.Read(buf, msgs[:0])
		if err != nil {
			return fmt.Errorf("read userfaultfd: %w", err)
		}
		if len(msgs) > 0 {
			h.serve(msgs)
			idle, spins = time.Time{}, 0
			continue
		}
		if len(h.in) >= ctlHeader {
			// Commands read while following the region.
			if done, err := h.commands(); err != nil || done {
				return err
			}
		}
		if h.nres > h.cfg.CapPages && h.err == nil {
			// No fault waiting: evict a few pages, then look again.
			h.evictNow(min(h.nres-h.cfg.CapPages, idleEvict))
			continue
		}
		timeout := -1
		if h.cfg.Spin > 0 {
			if spins == 0 {
				idle = time.Now()
			}
			spins++
			if time.Since(idle) < h.cfg.Spin {
				if spins%32 != 0 {
					rawconn.Yield()
					continue
				}
				timeout = 0
			}
		}
		fds[0] = unix.PollFd{Fd: int32(h.u.Fd()), Events: unix.POLLIN}
		fds[1] = unix.PollFd{Fd: int32(h.ctrl), Events: unix.POLLIN}
		if len(h.out) > 0 {
			fds[1].Events |= unix.POLLOUT
		}
		if _, err := unix.Poll(fds[:], timeout); err != nil && err != unix.EINTR {
			return fmt.Errorf("poll: %w", err)
		}
		if fds[1].Revents != 0 {
			done, err := h.control()
			if err != nil || done {
				return err
			}
		}
		if timeout == -1 {
			idle, spins = time.Time{}, 0 // woken: spin afresh
		}
	}
}

// control moves bytes on the control socket and runs complete commands. It
// reports done when the handler should exit.
func (h *faultHandler) control() (bool, error) {
	if h.readCtl() {
		return true, nil // the parent is gone: nothing left to serve
	}
	return h.commands()
}

// commands runs the complete commands in h.in (some may have arrived
// while the handler waited for a new connection) and writes the replies.
// It reports done when the handler should exit.
func (h *faultHandler) commands() (bool, error) {
	for len(h.in) >= ctlHeader {
		n := int(binary.BigEndian.Uint32(h.in[1:]))
		if len(h.in) < ctlHeader+n {
			break
		}
		op := h.in[0]
		h.in = h.in[ctlHeader+n:]
		h.command(op)
	}
	if err := h.flushOut(h.closing); err != nil {
		return true, err
	}
	return h.closing, nil
}

// readCtl reads what the control socket holds without blocking: bytes
// into h.in, descriptors passed with them into h.fds. It reports the
// parent's end.
func (h *faultHandler) readCtl() (gone bool) {
	var tmp [4096]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(h.ctrl, tmp[:], oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return false
		}
		if err != nil || n == 0 {
			return true
		}
		if oobn > 0 {
			if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, cm := range cms {
					if fds, err := unix.ParseUnixRights(&cm); err == nil {
						h.fds = append(h.fds, fds...)
					}
				}
			}
		}
		h.in = append(h.in, tmp[:n]...)
	}
}

// takeFd takes the next descriptor received (-1 if none).
func (h *faultHandler) takeFd() int {
	if len(h.fds) == 0 {
		return -1
	}
	fd := h.fds[0]
	h.fds = h.fds[1:]
	return fd
}

func (h *faultHandler) command(op uint8) {
	switch op {
	case ctlConn:
		// A connection that came after its follow gave up: unused.
		if fd := h.takeFd(); fd >= 0 {
			_ = unix.Close(fd)
		}
	case ctlHandoff: // its connection's, which came too late: unused
		h.handoff = nil
	case ctlFlush:
		h.reply(op, h.errPayload(h.flush()))
	case ctlStats:
		if h.nres > h.cfg.CapPages && h.err == nil {
			h.evictNow(h.nres - h.cfg.CapPages)
		}
		s := h.stats
		s.Resident, s.CachePages = h.nres, h.cfg.CapPages
		s.ServiceTime = h.svc
		var ru unix.Rusage
		if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
			s.HandlerCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
		b, _ := json.Marshal(s)
		h.reply(op, b)
	case ctlReset:
		h.stats = Stats{}
		h.svc, h.svcN = h.svc[:0], 0
		h.reply(op, nil)
	case ctlErr:
		h.reply(op, h.errPayload(h.err))
	case ctlClose:
		h.closing = true
		h.reply(op, h.errPayload(h.flush()))
	default:
		h.reply(op, h.errPayload(fmt.Errorf("memory: unknown handler command %d", op)))
	}
}

func (h *faultHandler) errPayload(err error) []byte {
	if err == nil {
		return nil
	}
	lost := byte(0)
	if errors.Is(err, protocol.ErrDonorLost) {
		lost = 1
	}
	return append([]byte{lost}, err.Error()...)
}

func (h *faultHandler) reply(op uint8, payload []byte) {
	var hdr [ctlHeader]byte
	hdr[0] = op
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	h.out = append(append(h.out, hdr[:]...), payload...)
}

// flushOut writes pending replies without blocking (or, when block, until
// they are all out: only before exiting).
func (h *faultHandler) flushOut(block bool) error {
	for len(h.out) > 0 {
		n, err := unix.Write(h.ctrl, h.out)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if !block {
				return nil
			}
			fds := [1]unix.PollFd{{Fd: int32(h.ctrl), Events: unix.POLLOUT}}
			_, _ = unix.Poll(fds[:], 1000)
			continue
		}
		if err != nil {
			return nil // the parent is gone
		}
		h.out = h.out[n:]
	}
	return nil
}

func (h *faultHandler) flush() error {
	tries := 0
	for {
		if h.err != nil {
			return h.err
		}
		run := h.dirtyBuf[:0]
		for i := range h.pages {
			if h.resident[i] && h.dirty[i] {
				run = append(run, i)
			}
		}
		h.dirtyBuf = run
		err := h.writeBack(run)
		if err == nil {
			return nil
		}
		if connLost(err) {
			err = h.follow(err, &tries) // then what is still dirty, again
		}
		if err != nil {
			return h.fail(err)
		}
	}
}

func (h *faultHandler) addr(i int) uintptr { return h.base + uintptr(i*h.ps) }

// LRU: head (next of sentinel) is most recent.
func (h *faultHandler) lruRemove(i int) {
	p, n := h.prev[i], h.next[i]
	h.next[p], h.prev[n] = n, p
}

func (h *faultHandler) lruPush(i int) {
	s := int32(h.pages)
	hd := h.next[s]
	h.prev[i], h.next[i] = s, hd
	h.prev[hd] = int32(i)
	h.next[s] = int32(i)
}

// maxBatch is the most faults faultBatch fetches together.
const maxBatch = 16

// Following a region that moved. When the donor connection ends (a READ
// or a write-back answered GONE, the connection closed or silent) and the
// mapping's session follows its region (handlerConfig.Follow), the
// handler asks the parent for a new connection (ctlReopen; the parent's
// session finds the region's new place) and waits for it (ctlConn), then
// serves again what was under way: the faults not yet served (a page
// already installed is only woken again), and the write-backs not yet
// acknowledged (their pages stayed cached and dirty). Reads and writes of
// whole pages are idempotent, so a write-back that reached the old donor
// before it retired the region, and is sent again, changes nothing.

// maxFollows bounds the new connections one operation may take.
const maxFollows = 4

// connLost reports whether err is the donor connection's end (not a local
// failure, nor a malformed reply).
func connLost(err error) bool {
	return errors.Is(err, protocol.ErrDonorLost) || errors.Is(err, protocol.ErrGone)
}

// follow replaces the donor connection after it ended with cause, when
// the mapping follows its region: it asks the parent for a new connection
// and waits for it, at most followWait (serving nothing meanwhile: every
// fault needs the donor). *tries counts the follows of one operation. It
// returns cause when it cannot.
//
// The connection may have ended at the handler only: a write-back whose
// acknowledgement did not come in time (held by a move's pause, its
// payload late on its way) may still land at the donor, after the same
// page's next write-back on the new connection, and leave the donor with
// the older bytes. So the request names the connection (h.conn), and the
// new one, if of the same session, names it in its HELLO
// (protocol.ReplacedConnection): the donor ends it, and answers once
// nothing more of it can land.
func (h *faultHandler) follow(cause error, tries *int) error {
	if !h.cfg.Follow || h.err != nil || !connLost(cause) || *tries >= maxFollows {
		return cause
	}
	*tries++
	h.pg.Close()
	h.reply(ctlReopen, append(appendRef(nil, h.conn), h.errPayload(cause)...))
	deadline := time.Now().Add(followWait)
	for {
		_ = h.flushOut(false)
		if fd, ref, err, ok := h.connFrame(); ok {
			if err != nil {
				return fmt.Errorf("%w (and no new connection: %v)", cause, err)
			}
			if err := unix.SetNonblock(fd, true); err != nil {
				_ = unix.Close(fd)
				return fmt.Errorf("%w (new connection: %v)", cause, err)
			}
			h.pg = rawconn.New(fd, max(h.cfg.Spin, 0), h.cfg.Timeout)
			if h.cfg.TLS {
				if err := h.startTLS(); err != nil {
					h.pg.Close()
					if connLost(err) { // the region moved again: ask again
						return h.follow(err, tries)
					}
					return fmt.Errorf("%w (new connection: %v)", cause, err)
				}
			} else {
				h.conn = ref
			}
			h.stats.Follows++
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%w (no new connection within %v)", cause, followWait)
		}
		fds := [1]unix.PollFd{{Fd: int32(h.ctrl), Events: unix.POLLIN}}
		if len(h.out) > 0 {
			fds[0].Events |= unix.POLLOUT
		}
		if _, err := unix.Poll(fds[:], int(left/time.Millisecond)+1); err != nil && err != unix.EINTR {
			return fmt.Errorf("%w (poll: %v)", cause, err)
		}
		if fds[0].Revents&unix.POLLIN != 0 && h.readCtl() {
			return fmt.Errorf("%w (the program is gone)", cause)
		}
	}
}

// startTLS completes a new connection of a session over TLS, as the
// handler's first one was (runFaultHandler): the TLS session from the
// handoff that came with it (pinning the key of the new donor, which the
// program's session there verified against the CA), then the HELLO,
// naming the connection it replaces if the handoff says so.
func (h *faultHandler) startTLS() error {
	ho := h.handoff
	h.handoff = nil
	if ho == nil {
		return errors.New("no handoff came with it")
	}
	if err := h.pg.StartTLS(ho.TLSConfig(), false); err != nil {
		return err
	}
	id, err := client.Hello(h.pg, ho.Hello, ho.Replaces)
	if err != nil {
		return err
	}
	h.conn = client.ConnRef{Session: ho.Hello.Session, ID: id}
	return nil
}

// connFrame takes the first ctlConn frame out of h.in, leaving the
// commands around it in order: the connection's descriptor and ConnRef
// (the zero one over TLS), or why the parent has none. ok is false while
// there is none. A ctlHandoff frame before it (a session over TLS) is
// taken into h.handoff.
func (h *faultHandler) connFrame() (fd int, ref client.ConnRef, err error, ok bool) {
	for k := 0; k+ctlHeader <= len(h.in); {
		n := int(binary.BigEndian.Uint32(h.in[k+1:]))
		if k+ctlHeader+n > len(h.in) {
			return -1, client.ConnRef{}, nil, false
		}
		if h.in[k] == ctlHandoff {
			var ho client.Handoff
			if json.Unmarshal(h.in[k+ctlHeader:k+ctlHeader+n], &ho) == nil {
				h.handoff = &ho
			} else {
				h.handoff = nil
			}
			h.in = append(h.in[:k], h.in[k+ctlHeader+n:]...)
			continue
		}
		if h.in[k] != ctlConn {
			k += ctlHeader + n
			continue
		}
		p := slices.Clone(h.in[k+ctlHeader : k+ctlHeader+n])
		h.in = append(h.in[:k], h.in[k+ctlHeader+n:]...)
		if len(p) == 0 || p[0] != connOK {
			msg := "no reason given"
			if len(p) > 1 {
				msg = string(p[1:])
			}
			return -1, client.ConnRef{}, errors.New(msg), true
		}
		if fd = h.takeFd(); fd < 0 {
			return -1, client.ConnRef{}, errors.New("no descriptor came with it"), true
		}
		ref, _ = readRef(p[1:])
		return fd, ref, nil, true
	}
	return -1, client.ConnRef{}, nil, false
}

// restore puts dirty pages whose write-back was sent but not acknowledged
// back in the cache's LRU: they stay resident and dirty (write-protected,
// so a later store marks them dirty again), written back later.
func (h *faultHandler) restore(pages []int) {
	for _, v := range pages {
		h.lruPush(v)
	}
}

// serve serves the fault messages read together. Missing-page faults on
// several distinct pages (threads faulting concurrently) are fetched
// together by faultBatch; every other fault is served by fault. When the
// donor connection ends and the mapping follows its region, they are
// served again over the new connection (see follow); otherwise, or when
// there is none, the mapping fails and the faults not served are refused.
func (h *faultHandler) serve(msgs []uffd.Msg) {
	t0 := time.Now()
	tries := 0
	for {
		err := h.serveOnce(msgs, t0)
		if err == nil {
			return
		}
		if err = h.follow(err, &tries); err != nil {
			_ = h.fail(err) // serveOnce then refuses what is left
		}
	}
}

// serveOnce is serve's work over the current connection; it returns the
// connection's error, the cache left consistent.
func (h *faultHandler) serveOnce(msgs []uffd.Msg, t0 time.Time) error {
	batch, pages := h.batch[:0], h.batchPages[:0]
	room := min(len(h.stage)/h.ps, maxBatch)
	for _, msg := range msgs {
		if msg.Event != uffd.EventPagefault {
			continue
		}
		i := int((uintptr(msg.Address) - h.base) / uintptr(h.ps))
		switch {
		case uintptr(msg.Address) < h.base || i >= h.pages || h.err != nil || msg.Flags&uffd.FlagWP != 0 ||
			h.resident[i]:
			// installs nothing: cannot race the batch
			if err := h.fault(msg, t0); err != nil {
				return err
			}
		case slices.Contains(pages, i): // one copy wakes every thread waiting on the page
		default:
			if len(pages) == room {
				// Serve the full batch first: fault() on a page of
				// the batch (or a window over one) would install it
				// before faultBatch copies it again (EEXIST).
				if err := h.serveBatch(batch, pages, t0); err != nil {
					return err
				}
				batch, pages = batch[:0], pages[:0]
			}
			batch, pages = append(batch, msg), append(pages, i)
		}
	}
	h.batch, h.batchPages = batch, pages
	return h.serveBatch(batch, pages, t0)
}

func (h *faultHandler) serveBatch(batch []uffd.Msg, pages []int, t0 time.Time) error {
	switch len(batch) {
	case 0:
		return nil
	case 1:
		return h.fault(batch[0], t0)
	default:
		return h.faultBatch(batch, pages, t0)
	}
}

// fault serves one page-fault message. It returns the donor connection's
// error (the fault not served, or served without all of its readahead;
// the cache consistent); other failures fail the mapping here.
func (h *faultHandler) fault(msg uffd.Msg, t0 time.Time) error {
	i := int((uintptr(msg.Address) - h.base) / uintptr(h.ps))
	if uintptr(msg.Address) < h.base || i >= h.pages {
		return nil
	}
	if h.err != nil {
		h.refuse(i)
		return nil
	}
	if msg.Flags&uffd.FlagWP != 0 {
		if !h.resident[i] {
			_ = h.u.Wake(h.addr(i), uintptr(h.ps))
			return nil
		}
		h.stats.WPFaults++
		if h.probedAt[i] != 0 {
			h.probedAt[i] = 0
			h.writeRate = 0.9*h.writeRate + 0.1
		}
		h.dirty[i] = true
		h.lruRemove(i)
		h.lruPush(i)
		if err := h.u.WriteProtect(h.addr(i), uintptr(h.ps), false, false); err != nil {
			_ = h.fail(fmt.Errorf("clear write protection: %w", err))
			h.refuse(i)
		}
		return nil
	}
	if h.resident[i] {
		_ = h.u.Wake(h.addr(i), uintptr(h.ps))
		return nil
	}
	// Readahead: sequential faults double the window, others reset it.
	if i == h.seqNext {
		h.raWin = min(h.raWin*2, h.cfg.MaxRA)
	} else {
		h.raWin = 1
	}
	n := 1
	for n < h.raWin && i+n < h.pages && !h.resident[i+n] {
		n++
	}
	t1 := time.Now()
	buf := h.stage[:n*h.ps]
	err := h.pg.Send(protocol.OpRead, buf, int64(i*h.ps))
	readSeq := h.pg.Seq
	var pending []int // dirty victims whose write-back follows the READ
	if err == nil {
		// While the page travels, make room for it: the faulting thread
		// is blocked, so no CPU runs the program's page tables and
		// dropping a page needs no TLB shootdown (evicting while the
		// program runs interrupts it for one).
		pending, err = h.evictDuringFault(h.nres + n - h.cfg.CapPages)
		if err == nil && h.err != nil { // a punch failed the mapping
			h.refuse(i)
			return nil
		}
	}
	// Only the faulting page is waited for: the rest of a readahead
	// window is installed below as it arrives.
	have := 0 // bytes of buf received
	if err == nil {
		have, err = h.pg.ReplyHead(h.rhdr[:], readSeq, protocol.OpRead, buf)
	}
	if err == nil && have < h.ps {
		var k int
		k, err = h.pg.RecvAtLeast([][]byte{buf[have:]}, h.ps-have)
		have += k
	}
	if err != nil {
		h.restore(pending)
		return err
	}
	t2 := time.Now()
	h.stats.FetchTime += t2.Sub(t1)
	src := uintptr(unsafe.Pointer(&h.stage[0]))
	if err := h.installFault(i, src, msg.Flags&uffd.FlagWrite != 0); err != nil {
		_ = h.fail(err)
		h.refuse(i)
		return nil
	}
	h.stats.InstallTime += time.Since(t2)
	h.record(t0)
	// The faulting thread is awake already. The rest of the window is
	// installed in pieces as its bytes arrive, so that copying pages in
	// overlaps the donor sending the next ones.
	for done := 1; done < n; {
		if have < (done+1)*h.ps {
			t := time.Now()
			k, err := h.pg.RecvAtLeast([][]byte{buf[have:]}, (done+1)*h.ps-have)
			h.stats.FetchTime += time.Since(t)
			if err != nil {
				// The faulting page is in; the rest of the window
				// faults again later.
				h.restore(pending)
				return err
			}
			have += k
		}
		t := time.Now()
		upto := have / h.ps
		if err := h.install(i+done, src+uintptr(done*h.ps), upto-done, true); err != nil {
			_ = h.fail(err)
			return nil
		}
		h.stats.InstallTime += time.Since(t)
		for j := i + done; j < i+upto; j++ {
			h.resident[j] = true
			h.lruPush(j)
		}
		h.nres += upto - done
		done = upto
	}
	if len(pending) > 0 {
		// The faulting thread runs again; the acknowledgements of the
		// write-backs sent behind the READ come next on the connection.
		if err := h.finishWriteBacks(pending, readSeq+1); err != nil {
			return err
		}
	}
	h.seqNext = i + n
	h.stats.PagesIn += int64(n - 1)
	return h.evictIfBehind()
}

// installFault installs page i from src for a missing-page fault (a write
// fault if write) and makes it resident. When most faulted pages end up
// written (read-modify-write patterns), a read-faulted page is installed
// writable and dirty at once, saving the write-protect fault that would
// follow; every 8th such fault still installs it protected so the estimate
// keeps learning.
func (h *faultHandler) installFault(i int, src uintptr, write bool) error {
	h.faultSeq++
	if !write && h.writeRate > 0.5 && h.faultSeq%8 != 0 {
		write = true
		h.stats.PreDirtied++
	} else if !write {
		h.probe(i)
	}
	if err := h.install(i, src, 1, !write); err != nil {
		return err
	}
	h.dirty[i] = write
	h.resident[i] = true
	h.lruPush(i)
	h.nres++
	h.stats.Faults++
	h.stats.PagesIn++
	return nil
}

// record records the service time of a fault that arrived at t0 and whose
// thread was just woken.
func (h *faultHandler) record(t0 time.Time) {
	d := time.Since(t0)
	if len(h.svc) < cap(h.svc) {
		h.svc = append(h.svc, d)
	} else {
		h.svc[h.svcN%len(h.svc)] = d
		h.svcN++
	}
}

// evictIfBehind evicts after serving faults if the cache has outgrown its
// size by a batch: eviction normally runs while no fault is waiting (see
// loop); only when faults come back to back does the cache outgrow its
// size that much, and then it is evicted here, after the faulting threads
// were woken. It returns the donor connection's error.
func (h *faultHandler) evictIfBehind() error {
	if h.nres > h.cfg.CapPages+h.cfg.Batch && h.err == nil {
		t0 := time.Now()
		defer func() { h.stats.EvictTime += time.Since(t0) }()
		return h.evictOr(max(h.nres-h.cfg.CapPages, h.cfg.Batch))
	}
	return nil
}

// faultBatch serves missing-page faults on several distinct pages, none
// resident, that arrived together (threads faulting concurrently): their
// READs go out in one writev before the first reply is read, so the donor
// serves them in one pass, and each faulting thread is woken as its page
// is installed. No readahead: concurrent faults are not one sequential
// stream. len(pages) ≤ the staging buffer's pages.
func (h *faultHandler) faultBatch(msgs []uffd.Msg, pages []int, t0 time.Time) error {
	if h.err != nil { // a batch served just before failed the mapping
		for _, i := range pages {
			h.refuse(i)
		}
		return nil
	}
	t1 := time.Now()
	first := h.pg.Seq + 1
	err := h.pg.SendPageReads(pages, h.ps, h.batchHdrs[:])
	var pending []int
	if err == nil {
		pending, err = h.evictDuringFault(h.nres + len(pages) - h.cfg.CapPages)
		if err == nil && h.err != nil {
			for _, i := range pages {
				h.refuse(i)
			}
			return nil
		}
	}
	h.raWin = 1
	src := uintptr(unsafe.Pointer(&h.stage[0]))
	for k, i := range pages {
		if err == nil {
			err = h.pg.Reply(h.rhdr[:], first+uint32(k), protocol.OpRead, h.stage[k*h.ps:(k+1)*h.ps])
		}
		if err != nil {
			// pages[:k] are in; the others are served again.
			h.restore(pending)
			return err
		}
		t2 := time.Now()
		h.stats.FetchTime += t2.Sub(t1)
		if err := h.installFault(i, src+uintptr(k*h.ps), msgs[k].Flags&uffd.FlagWrite != 0); err != nil {
			_ = h.fail(err)
			for _, j := range pages[k:] {
				h.refuse(j)
			}
			return nil
		}
		h.record(t0)
		t1 = time.Now()
		h.stats.InstallTime += t1.Sub(t2)
	}
	if len(pending) > 0 {
		if err := h.finishWriteBacks(pending, first+uint32(len(pages))); err != nil {
			return err
		}
	}
	h.stats.Batched += int64(len(pages))
	return h.evictIfBehind()
}

// probeHorizon is how many later probes a probed page has to be written
// before it counts as not written.
const probeHorizon = 256

type probe struct {
	page int32
	seq  uint64
}

// probe records that page i was installed write-protected by read fault
// h.faultSeq, judging the probe that leaves the ring as not written if its
// page still is.
func (h *faultHandler) probe(i int) {
	slot := &h.probes[h.nprobes%probeHorizon]
	if h.nprobes >= probeHorizon && h.probedAt[slot.page] == slot.seq {
		h.unwritten(int(slot.page))
	}
	h.nprobes++
	*slot = probe{page: int32(i), seq: h.faultSeq}
	h.probedAt[i] = h.faultSeq
}

// unwritten ends page v's probe, if any, as not written.
func (h *faultHandler) unwritten(v int) {
	if h.probedAt[v] != 0 {
		h.probedAt[v] = 0
		h.writeRate *= 0.9
	}
}

// maxPendingWriteBacks bounds the dirty victims written back behind one
// fault's READ.
const maxPendingWriteBacks = 4

// evictDuringFault makes room for want pages while a fault's READ is in
// flight: it takes the least recently used pages in order, punching clean
// ones out at once and, for dirty ones (at most maxPendingWriteBacks),
// write-protecting them and sending their write-backs behind the READ; it
// returns those, which finishWriteBacks drops once the donor acknowledged
// them. A dirty page is never dropped before its acknowledgement. An error
// is the connection's; a failed punch fails the mapping (h.err).
func (h *faultHandler) evictDuringFault(want int) ([]int, error) {
	if want <= 0 || h.err != nil {
		return nil, nil
	}
	t0 := time.Now()
	defer func() { h.stats.EvictTime += time.Since(t0) }()
	var pending []int
	clean := h.victims[:0]
	defer func() { h.victims = clean }()
	s := int32(h.pages)
	for ; want > 0 && h.prev[s] != s; want-- {
		v := int(h.prev[s])
		if h.dirty[v] {
			if len(pending) == maxPendingWriteBacks {
				break
			}
			if err := h.u.WriteProtect(h.addr(v), uintptr(h.ps), true, false); err != nil {
				_ = h.fail(fmt.Errorf("write-protect for write-back: %w", err))
				return pending, nil
			}
			h.lruRemove(v)
			pending = append(pending, v)
			if err := h.pg.Send(protocol.OpWrite, h.mem[v*h.ps:(v+1)*h.ps], int64(v*h.ps)); err != nil {
				slices.Sort(clean) // out of the LRU already: drop them
				if derr := h.drop(clean); derr != nil {
					_ = h.fail(derr)
				}
				return pending, err
			}
			continue
		}
		h.lruRemove(v)
		h.unwritten(v)
		clean = append(clean, v)
	}
	// Least recently used pages of a sequential scan are contiguous: one
	// punch per run (a punch costs several µs, a readahead window evicts
	// up to 64 pages).
	slices.Sort(clean)
	if err := h.drop(clean); err != nil {
		_ = h.fail(err)
	}
	return pending, nil
}

// drop punches the sorted pages, out of the LRU already, out of the cache:
// one fallocate per run of contiguous pages.
func (h *faultHandler) drop(pages []int) error {
	for k := 0; k < len(pages); {
		j := k + 1
		for j < len(pages) && pages[j] == pages[j-1]+1 {
			j++
		}
		lo, hi := pages[k], pages[j-1]+1
		if err := h.punch(lo, hi); err != nil {
			return err
		}
		for v := lo; v < hi; v++ {
			h.dirty[v], h.resident[v] = false, false
		}
		h.nres -= hi - lo
		h.stats.Evictions += int64(hi - lo)
		h.stats.Punches++
		k = j
	}
	return nil
}

// finishWriteBacks reads the acknowledgements of the write-backs
// evictDuringFault sent (sequence numbers from first on) and drops those
// pages. A write to one of them meanwhile raised a write-protect fault,
// which finds it gone and is answered by a fresh fetch. It returns the
// donor connection's error, the pages not acknowledged back in the cache;
// a failed drop fails the mapping.
func (h *faultHandler) finishWriteBacks(pages []int, first uint32) error {
	var ack [protocol.HeaderSize]byte
	for k, v := range pages {
		if err := h.pg.Reply(ack[:], first+uint32(k), protocol.OpWrite, nil); err != nil {
			h.restore(pages[k:])
			return err
		}
		if err := h.drop([]int{v}); err != nil {
			_ = h.fail(err)
			return nil
		}
		h.stats.WriteBacks++
		h.stats.FaultWriteBacks++
	}
	return nil
}

// idleEvict is how many pages the handler evicts between two looks at the
// userfaultfd when it has nothing else to do.
const idleEvict = 4

// evictNow evicts the want least recently used pages, timing it,
// following the region if the donor connection ends meanwhile.
func (h *faultHandler) evictNow(want int) {
	t0 := time.Now()
	if err := h.evictOr(want); err != nil {
		_ = h.fail(err)
	}
	h.stats.EvictTime += time.Since(t0)
}

// evictOr is evict, following the region when the donor connection ends
// (see follow): it returns the error that stands.
func (h *faultHandler) evictOr(want int) error {
	tries := 0
	for {
		err := h.evict(want)
		if err == nil || !connLost(err) {
			return err
		}
		if err = h.follow(err, &tries); err != nil {
			return err
		}
		want = min(want, h.nres-h.cfg.CapPages)
		if want <= 0 {
			return nil
		}
	}
}

func (h *faultHandler) install(i int, src uintptr, n int, wp bool) error {
	for done := uintptr(0); done < uintptr(n*h.ps); {
		c, err := h.u.Copy(h.addr(i)+done, src+done, uintptr(n*h.ps)-done, wp)
		if c > 0 {
			done += uintptr(c) // EAGAIN may follow a partial copy
		}
		if err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return fmt.Errorf("UFFDIO_COPY page %d: %w", i+int(done)/h.ps, err)
		}
	}
	return nil
}

// refuse answers a fault on a failed mapping: the page gets a poison
// marker, so the touch raises SIGBUS (a panic under debug.SetPanicOnFault)
// instead of waiting forever or reading made-up data. Without
// UFFDIO_POISON the thread is only woken: the parent makes the region
// inaccessible when it learns of the failure (see Mapping.watch).
func (h *faultHandler) refuse(i int) {
	if h.u.Features&uffd.FeaturePoison != 0 {
		_ = h.u.Poison(h.addr(i), uintptr(h.ps), h.ps)
	}
	_ = h.u.Wake(h.addr(i), uintptr(h.ps))
}

// evict evicts the want least recently used pages: dirty ones are written
// back first.
func (h *faultHandler) evict(want int) error {
	victims := h.victims[:0]
	s := int32(h.pages)
	for len(victims) < want && h.prev[s] != s {
		v := int(h.prev[s])
		h.lruRemove(v)
		victims = append(victims, v)
	}
	slices.Sort(victims)
	h.victims = victims
	dirty := h.dirtyBuf[:0]
	for _, v := range victims {
		if h.dirty[v] {
			dirty = append(dirty, v)
		}
		h.unwritten(v)
	}
	h.dirtyBuf = dirty
	if err := h.writeBack(dirty); err != nil {
		h.restore(victims) // still cached; those written back are clean
		return err
	}
	return h.drop(victims)
}

// punch drops pages [lo, hi) from the region: the memfd's pages are freed
// and unmapped in both processes, so the next touch faults again.
func (h *faultHandler) punch(lo, hi int) error {
	err := unix.Fallocate(h.memfd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(lo*h.ps), int64((hi-lo)*h.ps))
	if err != nil {
		return fmt.Errorf("punch hole: %w", err)
	}
	return nil
}

// writeBack write-protects the sorted dirty pages, sends them to the donor
// in runs of contiguous pages — pipelined, up to writeBackWindow requests
// before their acknowledgements are read — and marks them clean.
func (h *faultHandler) writeBack(pages []int) error {
	maxRun := protocol.MaxPayload / h.ps
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
		hdrs := make([]byte, len(batch)*protocol.HeaderSize)
		bufs := make([][]byte, 0, 2*len(batch))
		first := h.pg.Seq + 1
		for i, r := range batch {
			if err := h.u.WriteProtect(h.addr(r.lo), uintptr((r.hi-r.lo)*h.ps), true, false); err != nil {
				return fmt.Errorf("write-protect for write-back: %w", err)
			}
			data := h.mem[r.lo*h.ps : r.hi*h.ps]
			hd := protocol.Header{Op: protocol.OpWrite, Seq: first + uint32(i), Offset: uint64(r.lo * h.ps), Length: uint32(len(data)), Payload: uint32(len(data))}
			hb := hdrs[i*protocol.HeaderSize : (i+1)*protocol.HeaderSize]
			hd.Encode(hb)
			bufs = append(bufs, hb, data)
		}
		h.pg.Seq += uint32(len(batch))
		if err := h.pg.SendV(bufs); err != nil {
			return err
		}
		var ack [protocol.HeaderSize]byte
		for i, r := range batch {
			if err := h.pg.Reply(ack[:], first+uint32(i), protocol.OpWrite, nil); err != nil {
				return err
			}
			for v := r.lo; v < r.hi; v++ {
				h.dirty[v] = false
			}
			h.stats.WriteBacks += int64(r.hi - r.lo)
		}
	}
	return nil
}

// writeBackWindow bounds the write-back requests in flight, so their
// acknowledgements always fit in the socket's receive buffer.
const writeBackWindow = 128

// fail records the mapping's fatal error and drops every cached page: from
// then on every touch faults and is refused.
func (h *faultHandler) fail(err error) error {
	if h.err == nil {
		h.err = fmt.Errorf("%w: %w", ErrMappingFailed, err)
		_ = h.punch(0, h.pages)
		// Evicted pages keep a write-protect marker, which UFFDIO_POISON
		// refuses to overwrite; lifting the protection clears them.
		_ = h.u.WriteProtect(h.base, uintptr(h.pages*h.ps), false, true)
		clear(h.resident)
		h.nres = 0
		h.reply(ctlFailed, h.errPayload(h.err))
		_ = h.flushOut(false)
	}
	return h.err
}
