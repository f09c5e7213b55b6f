package donor

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/internal/accept"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/dataplane/memory/internal/rawconn"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"golang.org/x/sys/unix"
)

// Donor errors.
var (
	ErrRegionExists = errors.New("memory: region already exists for this credential")
	ErrNoRegion     = errors.New("memory: no region for this credential")
	ErrInsufficient = errors.New("memory: not enough free memory to reserve the region")
	ErrBadSize      = errors.New("memory: region size must be positive")
	ErrDonorStopped = errors.New("memory: donor stopped")
	// ErrRetired refuses to serve again a region that moved away
	// (RetireRegion): its lease's data is written at its new place now.
	ErrRetired = errors.New("memory: region retired: it moved to another donor")
	// errExpired answers (StatusGone) a READ or WRITE that arrives once
	// its region's deadline has passed (SetRegionDeadline).
	errExpired        = errors.New("memory: the lease expired")
	errHandshakeLimit = 10 * time.Second
)

// DefaultMaxSessionConns is the default of Donor.MaxSessionConns: many
// times what a client opens (a sync connection, its bulk streams, its
// queue pairs, a fault connection per mapping).
const DefaultMaxSessionConns = 256

// DefaultMaxConns is the default of Donor.MaxConns: 32 sessions at
// DefaultMaxSessionConns. An idle connection holds no thread (IdleWait)
// and the threads the busy ones sleep on are bounded by MaxPollThreads,
// so the bound is that of what every connection holds, thread or not: a
// descriptor (two while it is idle: its own and its registration with
// the netpoller; the agent runs with 65536, shared by its data planes),
// a goroutine and its buffers (some 50 KiB under TLS).
const DefaultMaxConns = 8192

// DefaultMaxPollThreads is the default of Donor.MaxPollThreads: well
// below the Go runtime's limit of 10000 threads (debug.SetMaxThreads),
// which the runtime and the agent's other work share (the bound
// DefaultMaxConns was when every data connection held a thread).
const DefaultMaxPollThreads = 4096

// DefaultIdleWait is the default of Donor.IdleWait. A request after a
// pause of at least IdleWait pays for the move back from the netpoller
// (a netpoller wake-up, an epoll_ctl and a close: tens of µs, a fraction
// of a thousandth of the pause); a connection with a request at least
// every 20 ms (50 a second: an application's faults, a benchmark's round
// trips) never moves, and the threads the donor holds at once are those
// of the connections that had a request in the last 20 ms.
const DefaultIdleWait = 20 * time.Millisecond

// DefaultSendWait is the default of Donor.SendWait: twice the client's
// default request timeout (its Options.Timeout). A client that has taken
// none of a reply for that long has given up the request it answers, and
// a client that reads takes what the donor writes at once: each of its
// connections has a reader waiting for it (a control connection's for
// the credit updates).
const DefaultSendWait = 10 * time.Second

// DefaultMinSessionConns is the default of Donor.MinSessionConns: what a
// client opens with its defaults (a sync connection, two bulk streams, a
// queue pair) and a few mappings' fault connections or queue pairs more.
const DefaultMinSessionConns = 8

// DefaultCredits is the number of requests a queue pair may have
// outstanding at the donor (its receive buffers).
const DefaultCredits = 64

// Donor lends anonymous memory regions, one per lease credential, and serves
// them over the Rialto memory protocol.
//
// Single subscriber (as in Venice): a region belongs to at most one client
// session at a time. A session starts with a control connection (HELLO with
// session 0); the client's other connections join it by its session id, at
// any time while it lives (a data connection the donor closed, alone, is
// joined again once that connection's handler has returned: fence; a
// data connection's HELLO that names one of the session's it replaces,
// one its client gave up, ends that one and is answered once its handler
// has returned: protocol.ReplacedConnection, writer.replace). A
// second client is refused with protocol.ErrBusy while the session's control
// connection is open; when it closes, every connection of the session is
// closed and the region can be subscribed again (its contents are kept until
// RemoveRegion); the next session's data connections are answered their
// HELLO once the ended session's handlers have returned (fence).
type Donor struct {
	log *slog.Logger
	// TLS, if set, makes the donor require TLS (set before Serve): a
	// connection must start with a TLS handshake, and a plaintext HELLO is
	// answered StatusTLSRequired without its credential being looked at.
	// The server certificate must name the donor's host.
	TLS *tls.Config
	// Credits is the per-queue-pair credit window granted to clients; set
	// before Serve. Zero means DefaultCredits.
	Credits int
	// Spin is how long the thread serving a sync connection or a bulk
	// stream polls for the next request before sleeping (trading CPU for latency). Zero disables it:
	// on a machine without an idle core, spinning on both ends makes round
	// trips several times slower.
	Spin time.Duration
	// FaultSpin is how long the thread serving a mapping's fault
	// connection polls for the next request before sleeping in poll(2).
	// The fault handler at the other end spins too, and the faulting
	// application thread is blocked in the kernel meanwhile, so the two
	// spinners do not compete with the application. Zero means
	// DefaultFaultSpin; negative disables it.
	FaultSpin time.Duration
	// RefusalWait bounds how long RetireRegion waits for the writes it
	// refuses to be answered GONE before it closes the session's
	// connections, and how long TrackWrites and PauseWrites wait for a
	// write under way that receives none of its payload before they
	// close its connection (only it): an answer, and a write under way,
	// wait for the write's payload, which a borrower may withhold. Zero
	// means DefaultRefusalWait.
	RefusalWait time.Duration
	// RefusalWaitLimit bounds how long TrackWrites and PauseWrites wait
	// for writes under way whose payload keeps arriving, however slowly:
	// their connections are closed then. Zero means
	// DefaultRefusalWaitLimit.
	RefusalWaitLimit time.Duration
	// IdleWait is how long the thread serving a sync, bulk or fault
	// connection (or, under TLS, any connection) waits in poll(2) for the
	// next request before the connection moves to Go's netpoller, where
	// its goroutine waits holding no thread; the next request moves it
	// back (rawconn.Idle). Zero means DefaultIdleWait; negative: never
	// (every such connection holds a thread while it waits, as before).
	// Set before Serve.
	IdleWait time.Duration
	// MaxPollThreads bounds the threads the donor's connections sleep
	// in poll(2) on at once: a connection that was not idle for
	// IdleWait holds one (not while a reply waits on the netpoller for
	// its peer to read: rawconn.Idle). Past it, connections wait on the
	// netpoller (their requests pay a netpoller wake-up each) until a
	// thread is free: however many connections are busy at once, the Go
	// runtime's 10000 threads, past which it ends the process and every
	// tenant's region, are not reached. Set before Serve; zero means
	// DefaultMaxPollThreads.
	MaxPollThreads int
	// SendWait bounds how long a write of the donor's on a connection
	// (a reply, a control connection's credit update) waits for its
	// peer to take more of it (bytes its peer acknowledges, whether or
	// not the socket reports room for more: a slow reader's connection
	// lives on): a peer that took none for SendWait (up to
	// twice that on the control and queue connections of a plaintext
	// donor, whose writes wait on the netpoller) stopped reading, and its
	// connection is closed; a control connection's end ends its session.
	// Without it the handler waited for ever, and with it the session
	// (the region's subscription) or the connection (its share of
	// MaxConns), until the region was removed. Set before Serve; zero
	// means DefaultSendWait.
	SendWait time.Duration
	// MaxSessionConns bounds the data connections (sync, bulk, queue,
	// fault) one session has at once; a HELLO past it is refused with
	// StatusLimit, unless it replaces one of the session's connections.
	// Every connection costs the donor a descriptor, a goroutine and its
	// buffers (a busy one a thread too, see MaxPollThreads): one tenant
	// must not take them all. Set before Serve; zero means
	// DefaultMaxSessionConns.
	MaxSessionConns int
	// MaxConns bounds the data connections of every session together
	// (those of ended sessions whose handlers have not returned yet
	// included): a HELLO past it is refused with StatusLimit ("the donor
	// serves its limit of N data connections"), unless it replaces one
	// of its session's connections. Set before Serve; zero means
	// DefaultMaxConns (see there).
	MaxConns int
	// MinSessionConns is every session's guaranteed share of MaxConns:
	// its first MinSessionConns data connections (at most
	// MaxSessionConns) are admitted while the donor serves fewer than
	// MaxConns, and the donor keeps room for them. A connection past its
	// session's first MinSessionConns is admitted only while the donor's
	// data connections, plus the guaranteed ones the other live sessions
	// have not opened yet, plus a reserve of MaxConns/8 for sessions
	// still to come, stay under MaxConns: one tenant (a session, or a
	// few) cannot take the whole of MaxConns and lock the others out
	// (StatusLimit; admitShare). Set before Serve; zero means
	// DefaultMinSessionConns.
	MinSessionConns int
	// Clock times the moves' waits (RefusalWait and RefusalWaitLimit in
	// TrackWrites and PauseWrites) and a control connection's grace for
	// its writes under way once it ended (controlGrace; internal/clock);
	// nil: the real clock.
	Clock clock.Clock

	// fenceWaits counts the HELLOs waiting at a fence (move.go) now.
	fenceWaits atomic.Int32

	// idle is what the raw connections share to hold no thread while
	// idle (nil: IdleWait negative); made by the first Serve (idleOnce).
	idle     *rawconn.Idle
	idleOnce sync.Once
	// moved, if set (tests), is the idle connections' rawconn.Idle.Moved.
	moved func(fd int, parked bool)

	mu      sync.Mutex
	regions map[[32]byte]*region
	conns   map[net.Conn]struct{}
	// dataConns counts the data connections' writers, of every session,
	// from the HELLO until their handlers return (addWriterLocked,
	// dropWriter): what MaxConns bounds.
	dataConns int
	stopping  bool // Serve is closing every connection
	wg        sync.WaitGroup
}

type region struct {
	mem []byte
	// gen is the region's generation (protocol.HelloReply), drawn at
	// AddRegion; a region received for a move (ReceiveRegion) takes the
	// one its source carried (carried) when it is activated.
	gen       atomic.Uint64
	receiving bool   // added by ReceiveRegion, not activated yet (d.mu)
	carried   uint64 // the generation a move's source carried in its HELLO (d.mu)
	locked    bool
	sess      *session
	gone      bool
	suspended bool // refuses connections, keeps its memory (SuspendRegion)
	retired   bool // moved away (RetireRegion): suspended for good
	// users counts the handlers of the region's connections, of every
	// session: those of an ended session may still be draining.
	users sync.WaitGroup

	// A move of the region (move.go): its state, and the writes under
	// way that started without seeing one.
	writes dirty.Writes // a move's write gate (move.go)
	// The handlers of the region's data connections, of every session,
	// whose WRITEs a move's wait watches (move.go); d.mu.
	writers map[*writer]struct{}
	// deadline, if set, is when the region stops being served
	// (SetRegionDeadline): checked as each READ and WRITE arrives.
	deadline atomic.Pointer[clock.Deadline]
}

// expired reports whether r's deadline has passed: a READ or WRITE that
// arrives then is refused (StatusGone) without touching the region. One
// atomic load, and one clock reading while a deadline is set.
func (r *region) expired() bool {
	return r.deadline.Load().Passed()
}

type session struct {
	id     uint64
	reg    *region
	conns  map[net.Conn]struct{}
	nextQ  uint32
	ctrl   net.Conn
	ctrlMu sync.Mutex // serialises writes on ctrl
	closed bool
	// ended is closed when the session ends (endSession), and with it
	// the quit of every data connection's writer: a WRITE a move holds
	// (writeGate) gives up then, so that its handler returns.
	ended chan struct{}
	// links are the handlers of the session's data connections by
	// their id (the HELLO reply's; a queue's is its queue id), from
	// the HELLO until the handler returns (d.mu): a data connection's
	// HELLO may name one it replaces (see replace).
	links map[uint32]*writer

	credMu  sync.Mutex
	queues  map[uint32]*queueCredit
	credSig chan struct{}
}

type queueCredit struct {
	granted  uint32 // cumulative credits granted (initial + completions)
	reported uint32 // value last sent to the client
}

// New returns a donor that logs to logger (nil: discard).
func New(logger *slog.Logger) *Donor {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Donor{log: logger, regions: map[[32]byte]*region{}, conns: map[net.Conn]struct{}{}}
}

func credKey(credential string) [32]byte { return sha256.Sum256([]byte(credential)) }

func (d *Donor) maxSessionConns() int {
	if d.MaxSessionConns > 0 {
		return d.MaxSessionConns
	}
	return DefaultMaxSessionConns
}

func (d *Donor) maxConns() int {
	if d.MaxConns > 0 {
		return d.MaxConns
	}
	return DefaultMaxConns
}

func (d *Donor) minSessionConns() int {
	n := DefaultMinSessionConns
	if d.MinSessionConns > 0 {
		n = d.MinSessionConns
	}
	return min(n, d.maxSessionConns())
}

func (d *Donor) spin() time.Duration { return max(d.Spin, 0) }

func (d *Donor) sendWait() time.Duration {
	if d.SendWait > 0 {
		return d.SendWait
	}
	return DefaultSendWait
}

// boundedWriter is a connection served on the netpoller (a plaintext
// control or queue connection) as its handler writes to it: a write
// fails once its peer took none of it for wait (SendWait: the write's
// deadline, wait from its start, is renewed each time it passes with
// bytes taken meanwhile, so a peer that stops taking them mid-write has
// it fail within twice wait). A connection whose deadlines do nothing
// (rawconn's NetConn) bounds its own writes (rawconn.Conn.SetSendWait).
type boundedWriter struct {
	c    net.Conn
	wait time.Duration
}

func (b boundedWriter) Write(p []byte) (int, error) {
	done := 0
	for {
		if err := b.c.SetWriteDeadline(time.Now().Add(b.wait)); err != nil {
			return done, err
		}
		n, err := b.c.Write(p[done:])
		done += n
		if err == nil || n == 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return done, err
		}
	}
}

// idleConns is what the raw connections share to hold no thread while
// idle (nil: they never move to the netpoller).
func (d *Donor) idleConns() *rawconn.Idle {
	d.idleOnce.Do(func() {
		if d.IdleWait < 0 {
			return
		}
		wait := d.IdleWait
		if wait == 0 {
			wait = DefaultIdleWait
		}
		lim := d.MaxPollThreads
		if lim <= 0 {
			lim = DefaultMaxPollThreads
		}
		d.idle = &rawconn.Idle{Wait: wait, Max: lim, Moved: d.moved}
	})
	return d.idle
}

// setIdle makes p, a raw connection the donor serves, hold no thread
// while idle (IdleWait).
func (d *Donor) setIdle(p *rawconn.Conn) {
	if i := d.idleConns(); i != nil {
		p.SetIdle(i)
	}
}

// ParkedConns reports how many of the donor's raw connections (sync,
// bulk, fault; under TLS every kind) wait for their next request on the
// netpoller now, holding no thread (IdleWait), and how many threads the
// others hold for poll(2) (at most MaxPollThreads).
func (d *Donor) ParkedConns() (parked, polling int) {
	if i := d.idleConns(); i != nil {
		return i.Parked(), i.Polling()
	}
	return 0, 0
}

// DefaultRefusalWait is the donor's default RefusalWait: a borrower's
// requests time out sooner (the client's default Options.Timeout).
const DefaultRefusalWait = 5 * time.Second

func (d *Donor) refusalWait() time.Duration {
	if d.RefusalWait > 0 {
		return d.RefusalWait
	}
	return DefaultRefusalWait
}

// DefaultFaultSpin is the donor's default FaultSpin.
const DefaultFaultSpin = 50 * time.Microsecond

func (d *Donor) faultSpin() time.Duration {
	if d.FaultSpin == 0 {
		return DefaultFaultSpin
	}
	return max(d.FaultSpin, 0)
}

func (d *Donor) credits() int {
	if d.Credits > 0 {
		return d.Credits
	}
	return DefaultCredits
}

// memAvailable returns MemAvailable from /proc/meminfo in bytes, or -1.
func memAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return kb * 1024
			}
		}
	}
	return -1
}

// AddRegion reserves size bytes of anonymous memory for the lease whose
// credential is given: mmap, MADV_DONTFORK, and mlock when permitted (so the
// region is never swapped to the donor's own disk); without mlock the pages
// are populated up front. It refuses when the memory is not available.
func (d *Donor) AddRegion(credential string, size int64) error {
	return d.addRegion(credential, size, false)
}

// ReceiveRegion is AddRegion for a region that receives a move (under the
// transfer's credential): the control HELLO of a session on it may carry
// the generation of the region being moved (protocol.Hello's
// MoveGeneration), which the region takes when ActivateRegion serves it
// as the lease's. A region added by AddRegion ignores it.
func (d *Donor) ReceiveRegion(credential string, size int64) error {
	return d.addRegion(credential, size, true)
}

func (d *Donor) addRegion(credential string, size int64, receiving bool) error {
	if size <= 0 {
		return ErrBadSize
	}
	if credential == "" || len(credential) > protocol.MaxCredential {
		return fmt.Errorf("memory: credential must be 1..%d bytes", protocol.MaxCredential)
	}
	page := int64(os.Getpagesize())
	size = (size + page - 1) / page * page
	if size > int64(^uint(0)>>1) {
		return ErrBadSize
	}
	key := credKey(credential)
	d.mu.Lock()
	_, dup := d.regions[key]
	d.mu.Unlock()
	if dup {
		return ErrRegionExists
	}
	if avail := memAvailable(); avail >= 0 && size > avail {
		return fmt.Errorf("%w: want %d bytes, %d available", ErrInsufficient, size, avail)
	}
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("%w: mmap: %v", ErrInsufficient, err)
	}
	if err := unix.Madvise(mem, unix.MADV_DONTFORK); err != nil {
		_ = unix.Munmap(mem)
		return fmt.Errorf("memory: madvise dontfork: %w", err)
	}
	r := &region{mem: mem, receiving: receiving}
	r.gen.Store(newGeneration())
	if err := unix.Mlock(mem); err == nil {
		r.locked = true
	} else {
		d.log.Warn("memory region not locked; populating instead", "size", size, "err", err)
		if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != nil {
			_ = unix.Munmap(mem)
			return fmt.Errorf("%w: populate: %v", ErrInsufficient, err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, dup := d.regions[key]; dup {
		_ = unix.Munmap(mem)
		return ErrRegionExists
	}
	d.regions[key] = r
	d.log.Info("memory region reserved", "size", size, "locked", r.locked)
	return nil
}

// newGeneration draws a region's generation: random, never 0.
func newGeneration() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1
}

// RemoveRegion ends the region's session (closing its connections) and
// waits for the handlers of its connections, including those of sessions
// that ended before, then wipes the memory and frees it.
func (d *Donor) RemoveRegion(credential string) error {
	key := credKey(credential)
	d.mu.Lock()
	r, ok := d.regions[key]
	if !ok {
		d.mu.Unlock()
		return ErrNoRegion
	}
	delete(d.regions, key)
	r.gone = true
	s := r.sess
	d.mu.Unlock()
	r.abandonMove()
	if s != nil {
		d.endSession(s)
	}
	r.users.Wait()
	clear(r.mem)
	if r.locked {
		_ = unix.Munlock(r.mem)
	}
	if err := unix.Munmap(r.mem); err != nil {
		return fmt.Errorf("memory: munmap: %w", err)
	}
	d.log.Info("memory region wiped and released", "size", len(r.mem))
	return nil
}

// SuspendRegion ends the region's session (closing its connections), waits
// for their handlers and refuses new connections until ResumeRegion; the
// memory is kept as it is. A move of the region stays as it was: the
// WRITEs it held are refused with the session, and once the region is
// resumed its writes are still marked, or held while the move holds them
// (a sealed move whose commit will retire the region).
func (d *Donor) SuspendRegion(credential string) error {
	d.mu.Lock()
	r, ok := d.regions[credKey(credential)]
	if !ok {
		d.mu.Unlock()
		return ErrNoRegion
	}
	r.suspended = true
	s := r.sess
	d.mu.Unlock()
	if s != nil {
		d.endSession(s)
	}
	r.users.Wait()
	return nil
}

// SetRegionDeadline makes dl the deadline of the region of credential
// (nil: none): a READ or WRITE of any of its connections that arrives
// once dl has passed is answered StatusGone without touching the region,
// whether or not the region has been suspended or removed yet; moving dl
// (clock.Deadline.Set: a renewal) serves them again. A moved region
// (ActivateRegion) keeps its deadline. PING is answered as before.
func (d *Donor) SetRegionDeadline(credential string, dl *clock.Deadline) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.regions[credKey(credential)]
	if !ok || r.gone {
		return ErrNoRegion
	}
	r.deadline.Store(dl)
	return nil
}

// ResumeRegion accepts connections to a suspended region again. A
// retired region (one that moved away, until RemoveRegion) is not served
// again: ErrRetired.
func (d *Donor) ResumeRegion(credential string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.regions[credKey(credential)]
	if !ok || r.gone {
		return ErrNoRegion
	}
	if r.retired {
		return ErrRetired
	}
	r.suspended = false
	return nil
}

// endSession closes every connection of s and detaches it from its region.
func (d *Donor) endSession(s *session) {
	d.mu.Lock()
	if s.closed {
		d.mu.Unlock()
		return
	}
	s.closed = true
	close(s.ended)
	for _, w := range s.links {
		// Closed, as a connection the donor ends alone is: its handler
		// serves no further request, and a data connection's HELLO —
		// of a session opened next, too — is answered once the handler
		// has returned (fence): a WRITE the handler still takes in (the
		// payload bytes that had arrived before the close) must not
		// land after a write the next session had acknowledged.
		w.closed.Store(true)
		w.quitServing()
	}
	if s.reg.sess == s {
		s.reg.sess = nil
	}
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	for _, c := range conns {
		kill(c)
	}
	select {
	case s.credSig <- struct{}{}:
	default:
	}
}

// Serve accepts connections on ln until ctx is cancelled, then closes ln and
// every connection and waits for their handlers. It returns nil after
// cancellation, or the accept error that stopped it; an accept that
// failed for want of a descriptor or memory (EMFILE, ENFILE, ENOBUFS,
// ENOMEM) is retried after a wait (5 ms, doubling up to 1 s), the
// connections served going on.
func (d *Donor) Serve(ctx context.Context, ln net.Listener) error {
	d.mu.Lock()
	d.stopping = false
	d.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var err error
	var retry accept.Backoff
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			// Out of descriptors or memory, for now: the connection waits
			// in the backlog, and the sessions served go on (returning
			// ended them all).
			if retry.Retry(ctx, aerr, d.log) {
				continue
			}
			if ctx.Err() == nil {
				err = fmt.Errorf("memory: accept: %w", aerr)
			}
			break
		}
		retry.Reset()
		d.mu.Lock()
		d.conns[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go func() {
			defer d.wg.Done()
			d.handle(c)
		}()
	}
	d.mu.Lock()
	d.stopping = true
	for c := range d.conns {
		kill(c)
	}
	for _, r := range d.regions {
		r.abandonMove() // writes held by a move end too
	}
	d.mu.Unlock()
	d.wg.Wait()
	return err
}

func (d *Donor) dropConn(c net.Conn) {
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
	_ = c.Close()
}

// writeErr sends an error response.
func writeErr(w io.Writer, op uint8, seq uint32, status uint16, msg string) error {
	if len(msg) > protocol.MaxMessage {
		msg = msg[:protocol.MaxMessage]
	}
	b := make([]byte, protocol.HeaderSize+len(msg))
	h := protocol.Header{Op: op, Flags: protocol.FlagResponse, Status: status, Seq: seq, Payload: uint32(len(msg))}
	h.Encode(b)
	copy(b[protocol.HeaderSize:], msg)
	_, err := w.Write(b)
	return err
}

func (d *Donor) handle(c net.Conn) {
	defer d.dropConn(c)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = c.SetDeadline(time.Now().Add(errHandshakeLimit))
	if d.TLS != nil {
		first, err := peekByte(c)
		if err != nil {
			return
		}
		if first == tlsHandshakeRecord {
			d.handleTLS(c)
			return
		}
		// A plaintext HELLO: refused without looking at its credential.
		f, err := readHello(c)
		if err == nil || f.Op != 0 {
			_ = writeErr(c, protocol.OpHello, f.Seq, protocol.StatusTLSRequired,
				"memory: this donor requires TLS: connect with the lease's rialto-mems:// URI and the cluster CA")
		}
		d.log.Info("memory connection refused: plaintext on a donor that requires TLS", "remote", c.RemoteAddr().String())
		return
	}
	s, hello, w, ok := d.hello(c, c)
	if !ok {
		return
	}
	defer s.reg.users.Done()
	defer d.detach(s, c, w)
	_ = c.SetDeadline(time.Time{})
	switch hello.Kind {
	case protocol.KindControl:
		d.serveControl(s, c, nil)
	case protocol.KindBulk, protocol.KindSync:
		// Raw syscalls on a detached descriptor, one thread per
		// connection in use (an idle one waits on the netpoller:
		// IdleWait): bulk streams moved more data, and small sync
		// requests were answered sooner than from the netpoller (4 KiB
		// read p50 33–40 µs vs 44–45 µs, docs/memory-protocol.md).
		d.serveSync(s, c, hello.Kind, d.spin(), w)
	case protocol.KindFault:
		// A mapping's faults: one request at a time, answered from a
		// thread that spins for the next one before sleeping.
		d.serveSync(s, c, hello.Kind, d.faultSpin(), w)
	default:
		d.serveData(s, c, hello.Kind, w)
	}
}

// tlsHandshakeRecord is the first byte of a TLS connection (a handshake
// record); a memory-protocol frame starts with the magic's 'R'.
const tlsHandshakeRecord = 0x16

// peekByte returns the first byte the peer sent without consuming it.
func peekByte(c net.Conn) (byte, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, errors.New("memory: TLS needs a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var b [1]byte
	n, rerr := 0, error(nil)
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK)
		return rerr != unix.EAGAIN
	}); err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 {
		return 0, io.EOF
	}
	return b[0], nil
}

// handleTLS serves a connection that starts a TLS handshake. The
// handshake and the HELLO run on the netpoller, bounded by the
// connection's deadline: a peer that has not presented a credential costs
// a goroutine, never a thread (a handshake on a raw descriptor waited in
// poll(2), and anyone who could reach the donor held a thread per
// connection). Once the HELLO is answered, the descriptor is detached
// (see rawconn) and the session goes on on raw syscalls, from this
// goroutine's thread while in use (idle, on the netpoller: IdleWait):
// sync, bulk and fault connections are then served as serveSync serves
// plaintext ones; control and queue connections through the session as a
// net.Conn.
func (d *Donor) handleTLS(c net.Conn) {
	ho := rawconn.NewHandover(c)
	tc := tls.Server(ho, d.TLS)
	if err := tc.HandshakeContext(context.Background()); err != nil {
		d.log.Debug("memory: TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	s, hello, w, ok := d.hello(c, tc)
	if !ok {
		return
	}
	defer s.reg.users.Done()
	defer d.detach(s, c, w)
	_ = c.SetDeadline(time.Time{})
	fd, err := rawconn.Detach(c)
	if err != nil {
		return
	}
	p := rawconn.New(fd, 0, 0)
	defer p.Close()
	p.Adopt(ho, tc)
	p.SetSendWait(d.sendWait())
	d.setIdle(p)
	dc := detachedConn{Conn: c, p: p}
	if !d.swapConn(s, c, dc, false) {
		return // the session ended meanwhile
	}
	defer d.swapConn(s, dc, c, true) // handle's cleanup names c
	_ = c.Close()
	switch hello.Kind {
	case protocol.KindControl:
		// The credit sender writes while the reading goroutine reads.
		d.serveControl(s, p.NetConn(), p.Sender())
	case protocol.KindBulk, protocol.KindSync:
		p.SetSpin(d.spin())
		d.serveRaw(s, p, w)
	case protocol.KindFault:
		p.SetSpin(d.faultSpin())
		d.serveRaw(s, p, w)
	default:
		d.serveData(s, p.NetConn(), hello.Kind, w)
	}
}

// hello reads the HELLO frame from rw, authenticates it and adds c (which
// names the connection in the session) to its region's session, and
// answers it. On success the caller owns a users reference of the region
// and must detach c, with the writer of a data connection (nil for a
// control connection).
func (d *Donor) hello(c net.Conn, rw io.ReadWriter) (*session, protocol.Hello, *writer, bool) {
	f, err := readHello(rw)
	if err != nil {
		if f.Op != 0 || !errors.Is(err, io.EOF) {
			st := protocol.StatusProto
			if errors.Is(err, protocol.ErrVersion) {
				st = protocol.StatusVersion
			}
			_ = writeErr(rw, protocol.OpHello, f.Seq, st, err.Error())
		}
		return nil, protocol.Hello{}, nil, false
	}
	if f.Op != protocol.OpHello || f.IsResponse() {
		_ = writeErr(rw, f.Op, f.Seq, protocol.StatusProto, "memory: first frame must be HELLO")
		return nil, protocol.Hello{}, nil, false
	}
	hello, err := protocol.DecodeHello(f.Data)
	if err != nil {
		_ = writeErr(rw, protocol.OpHello, f.Seq, protocol.StatusProto, err.Error())
		return nil, protocol.Hello{}, nil, false
	}
	s, w, replaced, st, msg := d.attach(c, hello, f.Header)
	if replaced != nil {
		// The connection this one replaces: its client gave it up.
		// Ended now, it serves no further request, and a write it
		// holds for a move gives up; the fence waits for its handler.
		replaced()
	}
	if st == protocol.StatusOK && hello.Kind != protocol.KindControl && !d.fence(s.reg) {
		d.detach(s, c, w)
		s.reg.users.Done()
		st, msg = protocol.StatusBusy, "memory: a connection of the session the donor closed is still being served"
	}
	if st != protocol.StatusOK {
		d.log.Info("memory connection refused", "remote", c.RemoteAddr().String(), "reason", msg)
		_ = writeErr(rw, protocol.OpHello, f.Seq, st, msg)
		return nil, protocol.Hello{}, nil, false
	}
	// HELLO reply: offset = region size, length = max payload, credits =
	// initial window (queue connections), payload = session id, queue id
	// and, for a client that reads it (its HELLO's length), the region's
	// generation.
	credits := uint32(0)
	if hello.Kind == protocol.KindQueue {
		credits = uint32(d.credits())
	}
	withGen, n := f.Length >= protocol.HelloReplyGenSize, protocol.HelloReplySize
	if withGen {
		n = protocol.HelloReplyGenSize
	}
	var rep [protocol.HeaderSize + protocol.HelloReplyGenSize]byte
	h := protocol.Header{Op: protocol.OpHello, Flags: protocol.FlagResponse, Seq: f.Seq, Payload: uint32(n),
		Offset: uint64(len(s.reg.mem)), Length: protocol.MaxPayload, Credits: credits}
	h.Encode(rep[:])
	rb := protocol.HelloReply{Session: s.id, Generation: s.reg.gen.Load()}
	if w != nil {
		rb.Queue = w.id
	}
	rb.Encode(rep[:protocol.HeaderSize], withGen)
	if _, err := rw.Write(rep[:protocol.HeaderSize+n]); err != nil {
		d.detach(s, c, w)
		s.reg.users.Done()
		return nil, protocol.Hello{}, nil, false
	}
	return s, hello, w, true
}

// readHello reads a connection's first frame: a HELLO request's payload
// (at most protocol.HelloFixed+protocol.MaxCredential bytes), or only the
// header of any other frame (the caller refuses it), so that a peer that
// has not authenticated never has the donor take in a payload (up to
// protocol.MaxPayload) it withholds or trickles.
func readHello(r io.Reader) (protocol.Frame, error) {
	var hdr [protocol.HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return protocol.Frame{}, err
	}
	h, err := protocol.DecodeHeader(hdr[:])
	f := protocol.Frame{Header: h}
	if err != nil || h.Op != protocol.OpHello || h.IsResponse() {
		return f, err
	}
	f.Data = make([]byte, h.Payload) // bounded by DecodeHeader
	if _, err := io.ReadFull(r, f.Data); err != nil {
		return f, fmt.Errorf("%w: payload: %v", protocol.ErrBadFrame, err)
	}
	return f, nil
}

// attach authenticates hello (whose frame header is h) and adds c to the
// region's session; a data connection gets a writer (its id is the HELLO
// reply's). A data connection's HELLO that names another connection of
// the session it replaces (protocol.ReplacedConnection) marks that one's
// writer closed: the caller calls replaced (not nil then) once d.mu is
// released, which ends that connection.
func (d *Donor) attach(c net.Conn, hello protocol.Hello, h protocol.Header) (s *session, w *writer, replaced func(), st uint16, msg string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.regions[credKey(hello.Credential)]
	if !ok || r.gone || r.suspended {
		return nil, nil, nil, protocol.StatusAuth, "memory: credential refused"
	}
	if hello.Kind == protocol.KindControl {
		if r.sess != nil {
			return nil, nil, nil, protocol.StatusBusy, "memory: region has another subscriber"
		}
		var id [8]byte
		_, _ = rand.Read(id[:])
		s = &session{id: binary.BigEndian.Uint64(id[:]) | 1, reg: r, conns: map[net.Conn]struct{}{},
			ctrl: c, queues: map[uint32]*queueCredit{}, credSig: make(chan struct{}, 1), links: map[uint32]*writer{}}
		s.ended = make(chan struct{})
		r.sess = s
		if g := protocol.MoveGeneration(h); g != 0 && r.receiving {
			// A move's source: the region it sends keeps its generation.
			r.carried = g
		}
	} else {
		s = r.sess
		if s == nil || s.id != hello.Session || s.closed {
			return nil, nil, nil, protocol.StatusBusy, "memory: not the region's current session"
		}
		if old := s.links[protocol.ReplacedConnection(h)]; old != nil {
			replaced = old.replace()
		} else if msg := d.admitLocked(s); msg != "" {
			return nil, nil, nil, protocol.StatusLimit, msg
		}
		s.nextQ++
		w = d.addWriterLocked(s, s.nextQ)
		if hello.Kind == protocol.KindQueue {
			s.credMu.Lock()
			s.queues[w.id] = &queueCredit{granted: uint32(d.credits()), reported: uint32(d.credits())}
			s.credMu.Unlock()
		}
	}
	s.conns[c] = struct{}{}
	r.users.Add(1)
	return s, w, replaced, protocol.StatusOK, ""
}

// admitLocked decides whether session s may add a data connection
// (d.mu held): "" if it may, else the refusal's message (StatusLimit).
// The limits, in order: MaxSessionConns for the session, MaxConns for
// the donor, and past the session's guaranteed share (MinSessionConns)
// the room the donor keeps for the other sessions' (admitShare).
func (d *Donor) admitLocked(s *session) string {
	const refused = "memory: the donor's connection limit is reached: "
	n, lim := len(s.links), d.maxConns()
	if sl := d.maxSessionConns(); n >= sl {
		return refused + fmt.Sprintf("%d data connections per session", sl)
	}
	if d.dataConns >= lim {
		return refused + fmt.Sprintf("the donor serves its limit of %d data connections", lim)
	}
	if g := d.minSessionConns(); n >= g && !d.admitShareLocked(s, g, lim) {
		return refused + fmt.Sprintf("the session has %d data connections, and the donor (serving %d of %d) keeps the rest for other sessions' first %d",
			n, d.dataConns, lim, g)
	}
	return ""
}

// admitShareLocked reports whether session s, which has its guaranteed
// g data connections already, may add one (d.mu held): only while the
// donor's data connections, plus the guaranteed ones the other live
// sessions have not opened yet, plus a reserve of lim/8 for sessions
// still to come, stay under lim (MaxConns). Without it one tenant
// holding a few leases took all of MaxConns, and every other tenant's
// session was refused its connections until that one let some go.
func (d *Donor) admitShareLocked(s *session, g, lim int) bool {
	held := d.dataConns + lim/8
	for _, r := range d.regions {
		o := r.sess
		if o != nil && o != s && !o.closed {
			held += max(g-len(o.links), 0)
		}
	}
	return held < lim
}

// detach takes c, and its writer w (nil: none), out of s: w's handler
// has returned, or never served.
func (d *Donor) detach(s *session, c net.Conn, w *writer) {
	d.mu.Lock()
	delete(s.conns, c)
	d.mu.Unlock()
	if w != nil {
		d.dropWriter(s, w)
	}
}

// controlGrace bounds how long the end of a control connection (its
// peer's end read, or a frame refused) waits for the writes still under
// way on it, the credit sender's and the refusal's, before the donor
// shuts the connection down under them and ends the session. A peer that
// reads (a client's Close: it half-closes and reads until the donor's
// end) takes a 32-byte frame in well within it, so the normal end is as
// before, the session ended before the connection is closed; a peer that
// has not drained the connection in a second has stopped reading, and its
// writes would wait for SendWait (before it, for ever), the session (and
// the region's subscription: a new session is BUSY) with them.
const controlGrace = time.Second

// serveControl reads pings on the control connection c and answers
// them, and writes credit updates (through send, for the writes of
// goroutines other than the reading one: nil, c's own); when the
// connection ends, so does the session: once the writes under way on it
// are done, or after controlGrace (its peer stopped reading) with the
// connection shut down under them. Every write is bounded by SendWait:
// a peer that stopped reading has the connection end, a PING's answer
// or a credit update that it took none of for SendWait failing.
func (d *Donor) serveControl(s *session, c net.Conn, send io.Writer) {
	defer d.endSession(s)
	// out: the reading goroutine's writes (PING answers).
	out := io.Writer(boundedWriter{c: c, wait: d.sendWait()})
	if send == nil {
		send = out
	}
	done := make(chan struct{})
	// wg: the credit sender, and a refusal's write.
	var wg sync.WaitGroup
	wg.Go(func() { // credit sender: coalesces updates (overwriteable, cumulative)
		var b [protocol.HeaderSize]byte
		for {
			select {
			case <-done:
				return
			case <-s.credSig:
			}
			s.credMu.Lock()
			type upd struct{ q, v uint32 }
			var ups []upd
			for q, qc := range s.queues {
				if qc.reported != qc.granted {
					qc.reported = qc.granted
					ups = append(ups, upd{q, qc.granted})
				}
			}
			s.credMu.Unlock()
			for _, u := range ups {
				h := protocol.Header{Op: protocol.OpCredit, Flags: protocol.FlagResponse, Offset: uint64(u.q), Credits: u.v}
				h.Encode(b[:])
				s.ctrlMu.Lock()
				_, err := send.Write(b[:])
				s.ctrlMu.Unlock()
				if err != nil {
					// Its peer stopped reading (SendWait), or the
					// connection ended: the reads end too, and the
					// session with them.
					kill(c)
					return
				}
			}
		}
	})
	defer d.endControl(c, done, &wg)
	var hdr [protocol.HeaderSize]byte
	for {
		// The header alone: a PING carries no payload (DecodeHeader), and
		// any other frame is refused without taking its payload in (up
		// to protocol.MaxPayload, which the donor would allocate).
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		f, err := protocol.DecodeHeader(hdr[:])
		if err != nil {
			return
		}
		if f.Op != protocol.OpPing || f.IsResponse() {
			// Written alongside the credit sender, and bounded as its
			// writes are (endControl): a peer that does not read has
			// it wait.
			wg.Go(func() {
				s.ctrlMu.Lock()
				_ = writeErr(send, f.Op, f.Seq, protocol.StatusProto, "memory: only PING on the control connection")
				s.ctrlMu.Unlock()
			})
			return
		}
		h := protocol.Header{Op: protocol.OpPing, Flags: protocol.FlagResponse, Seq: f.Seq}
		var b [protocol.HeaderSize]byte
		h.Encode(b[:])
		s.ctrlMu.Lock()
		_, err = out.Write(b[:])
		s.ctrlMu.Unlock()
		if err != nil {
			return // its peer stopped reading (SendWait), or the connection ended
		}
	}
}

// endControl ends the writes on control connection c once its reads
// have: it stops the credit sender (done) and waits for wg's writers, up
// to controlGrace; then it shuts c down (kill), so that a write its peer
// does not take in returns, and waits for them.
func (d *Donor) endControl(c net.Conn, done chan struct{}, wg *sync.WaitGroup) {
	close(done)
	left := make(chan struct{})
	go func() { // owned here: waited for below
		wg.Wait()
		close(left)
	}()
	t := clock.Or(d.Clock).NewTimer(controlGrace)
	defer t.Stop()
	select {
	case <-left:
	case <-t.C():
		kill(c)
		<-left
	}
}

// complete records one completed queue request and, when enough have
// accumulated or the queue went idle, asks the credit sender to report.
func (s *session) complete(qid uint32, idle bool, batch uint32) {
	s.credMu.Lock()
	qc := s.queues[qid]
	if qc == nil { // dropped with its connection (dropWriter)
		s.credMu.Unlock()
		return
	}
	qc.granted++
	send := idle || qc.granted-qc.reported >= batch
	s.credMu.Unlock()
	if send {
		select {
		case s.credSig <- struct{}{}:
		default:
		}
	}
}

// serveData serves READ, WRITE and PING on a sync, bulk or queue connection
// (whose writer is w: a queue's id is w.id). Requests are executed in
// order; responses are buffered and flushed when no further request is
// already buffered, so pipelined requests share syscalls. A write its
// peer takes none of for SendWait ends the connection.
func (d *Donor) serveData(s *session, c net.Conn, kind uint8, w *writer) {
	mem := s.reg.mem
	size := uint64(len(mem))
	br := bufio.NewReaderSize(c, 64<<10)
	cw := boundedWriter{c: c, wait: d.sendWait()}
	bw := bufio.NewWriterSize(cw, 64<<10)
	var hdr, out [protocol.HeaderSize]byte
	var received uint32 // queue requests received
	var completed uint32
	window := uint32(d.credits())
	batch := max(window/4, 1)
	discard := func(n uint32) error {
		_, err := br.Discard(int(n))
		return err
	}
	if !d.serving(w, func() { kill(c) }) {
		return // replaced before it served
	}
	for {
		if w.closed.Load() {
			return // a request already buffered is not served (fence)
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		h, err := protocol.DecodeHeader(hdr[:])
		if err != nil || h.IsResponse() || h.Op == protocol.OpHello || h.Op == protocol.OpCredit {
			msg := "memory: unexpected frame"
			if err != nil {
				msg = err.Error()
			}
			_ = writeErr(bw, h.Op, h.Seq, protocol.StatusProto, msg)
			_ = bw.Flush()
			return
		}
		if kind == protocol.KindQueue && h.Op != protocol.OpPing {
			received++
			if int32(received-completed) > int32(window) {
				_ = writeErr(bw, h.Op, h.Seq, protocol.StatusCredit, "memory: request beyond granted credits")
				_ = bw.Flush()
				return
			}
		}
		rh := protocol.Header{Op: h.Op, Flags: protocol.FlagResponse, Seq: h.Seq, Offset: h.Offset, Length: h.Length}
		inRange := h.Offset <= size && uint64(h.Length) <= size-h.Offset
		switch {
		case h.Op == protocol.OpPing:
			rh.Encode(out[:])
			_, err = bw.Write(out[:])
		case s.reg.expired():
			// Arrived once the lease's known expiry passed: refused
			// whether or not the region was suspended yet.
			if h.Op == protocol.OpWrite {
				err = discard(h.Length)
			}
			if err == nil {
				err = writeErr(bw, h.Op, h.Seq, protocol.StatusGone, errExpired.Error())
			}
		case h.Op == protocol.OpRead:
			if !inRange {
				err = writeErr(bw, h.Op, h.Seq, protocol.StatusRange, fmt.Sprintf("memory: read [%d,+%d) outside region of %d bytes", h.Offset, h.Length, size))
				break
			}
			rh.Payload = h.Length
			rh.Encode(out[:])
			if _, err = bw.Write(out[:]); err == nil {
				data := mem[h.Offset : h.Offset+uint64(h.Length)]
				if len(data) > bw.Available() {
					if err = bw.Flush(); err == nil {
						_, err = cw.Write(data)
					}
				} else {
					_, err = bw.Write(data)
				}
			}
		case h.Op == protocol.OpWrite:
			if !inRange {
				if err = discard(h.Length); err == nil {
					err = writeErr(bw, h.Op, h.Seq, protocol.StatusRange, fmt.Sprintf("memory: write [%d,+%d) outside region of %d bytes", h.Offset, h.Length, size))
				}
				break
			}
			mv, ok := s.reg.writeGate(w.quit)
			if !ok {
				// Moved (RetireRegion): the write is refused, the
				// session ends.
				if discard(h.Length) == nil {
					_ = writeErr(bw, h.Op, h.Seq, protocol.StatusGone, errRetired.Error())
				}
				_ = bw.Flush()
				s.reg.writeRefused(mv)
				return
			}
			w.begin(mv)
			err = w.read(br, mem[h.Offset:h.Offset+uint64(h.Length)])
			w.end()
			s.reg.writeDone(mv, h.Offset, uint64(h.Length))
			if err != nil {
				return
			}
			rh.Encode(out[:])
			_, err = bw.Write(out[:])
		}
		if err != nil {
			return
		}
		if kind == protocol.KindQueue && h.Op != protocol.OpPing {
			completed++
			s.complete(w.id, br.Buffered() == 0, batch)
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return
			}
		}
	}
}

// QueueWindows reports how many queue credit windows the current session
// of the region whose credential is given holds: one per queue connection
// of the session whose handler has not returned (0 without a session).
// A queue connection the client re-establishes takes a new window, and
// the window of the one it replaces goes with that one's handler.
func (d *Donor) QueueWindows(credential string) int {
	d.mu.Lock()
	r := d.regions[credKey(credential)]
	var s *session
	if r != nil {
		s = r.sess
	}
	d.mu.Unlock()
	if s == nil {
		return 0
	}
	s.credMu.Lock()
	defer s.credMu.Unlock()
	return len(s.queues)
}

// Regions reports the number of regions reserved.
func (d *Donor) Regions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.regions)
}

// kill shuts a connection down (waking a handler blocked on a duplicate of
// its descriptor) and closes it.
func kill(c net.Conn) {
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
		}
	}
	_ = c.Close()
}

// detachedConn stands for a connection served on a detached descriptor
// (serveSync) in the donor's connection sets: Close shuts the socket down,
// which ends the thread serving it.
type detachedConn struct {
	net.Conn // the original, closed: for its addresses
	p        *rawconn.Conn
}

func (c detachedConn) Close() error {
	c.p.Shutdown()
	return nil
}

// swapConn replaces old by nu in the donor's and s's connection sets; false
// (and nothing replaced) if s has ended, unless back (putting the original
// back for handle's cleanup).
func (d *Donor) swapConn(s *session, old, nu net.Conn, back bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.closed && !back {
		return false
	}
	if _, ok := d.conns[old]; ok {
		delete(d.conns, old)
		d.conns[nu] = struct{}{}
	}
	if _, ok := s.conns[old]; ok {
		delete(s.conns, old)
		s.conns[nu] = struct{}{}
	}
	return true
}

// serveSync serves a bulk (or synchronous) connection with raw syscalls on
// a duplicate descriptor, one request after another: pipelined requests are
// answered in order, data going straight between the region and the socket.
// Non-TCP connections use serveData.
func (d *Donor) serveSync(s *session, c net.Conn, kind uint8, spin time.Duration, w *writer) {
	fd, err := rawconn.Detach(c)
	if err != nil {
		d.serveData(s, c, kind, w)
		return
	}
	p := rawconn.New(fd, spin, 0)
	defer p.Close()
	p.SetSendWait(d.sendWait())
	d.setIdle(p)
	// The connection sets name the connection by a stand-in whose Close
	// shuts the socket down; c itself is closed, taking it off the
	// netpoller (see rawconn).
	dc := detachedConn{Conn: c, p: p}
	if !d.swapConn(s, c, dc, false) {
		return // the session ended meanwhile
	}
	defer d.swapConn(s, dc, c, true) // handle's cleanup names c
	_ = c.Close()
	d.serveRaw(s, p, w)
}

// discardChunk is the most of a payload not applied that serveRaw reads
// at once (a TLS record's plaintext).
const discardChunk = 16 << 10

// serveRaw serves a sync, bulk or fault connection driven with raw
// syscalls (in plaintext, or inside its TLS session), whose writer is w,
// one request after another.
func (d *Donor) serveRaw(s *session, p *rawconn.Conn, w *writer) {
	mem := s.reg.mem
	size := uint64(len(mem))
	var in, out [protocol.HeaderSize]byte
	fail := func(h protocol.Header, st uint16, msg string) error {
		if len(msg) > protocol.MaxMessage {
			msg = msg[:protocol.MaxMessage]
		}
		rh := protocol.Header{Op: h.Op, Flags: protocol.FlagResponse, Status: st, Seq: h.Seq, Payload: uint32(len(msg))}
		rh.Encode(out[:])
		return p.SendV([][]byte{out[:], []byte(msg)})
	}
	// A WRITE's payload that is not applied (out of the region, or
	// refused: the region moved) is read through scratch, a chunk at a
	// time: the refusals of a move's held writes, one on each of the
	// session's connections at once, cost the donor a chunk each, not
	// their payloads (up to protocol.MaxPayload each).
	var scratch []byte
	discard := func(n uint32) error {
		if scratch == nil {
			scratch = make([]byte, discardChunk)
		}
		for n > 0 {
			k := min(n, discardChunk)
			if err := p.RecvV([][]byte{scratch[:k]}); err != nil {
				return err
			}
			n -= k
		}
		return nil
	}
	if !d.serving(w, p.Shutdown) {
		return // replaced before it served
	}
	for {
		if w.closed.Load() {
			return // a request already received is not served (fence)
		}
		if err := p.RecvV([][]byte{in[:]}); err != nil {
			return
		}
		h, err := protocol.DecodeHeader(in[:])
		if err != nil || h.IsResponse() || h.Op == protocol.OpHello || h.Op == protocol.OpCredit {
			msg := "memory: unexpected frame"
			if err != nil {
				msg = err.Error()
			}
			_ = fail(h, protocol.StatusProto, msg)
			return
		}
		rh := protocol.Header{Op: h.Op, Flags: protocol.FlagResponse, Seq: h.Seq, Offset: h.Offset, Length: h.Length}
		inRange := h.Offset <= size && uint64(h.Length) <= size-h.Offset
		switch {
		case h.Op == protocol.OpPing:
			rh.Encode(out[:])
			err = p.SendV([][]byte{out[:]})
		case s.reg.expired():
			// Arrived once the lease's known expiry passed: refused
			// whether or not the region was suspended yet.
			if h.Op == protocol.OpWrite {
				if err = discard(h.Length); err != nil {
					return
				}
			}
			err = fail(h, protocol.StatusGone, errExpired.Error())
		case !inRange:
			if h.Op == protocol.OpWrite {
				if err = discard(h.Length); err != nil {
					return
				}
			}
			err = fail(h, protocol.StatusRange, fmt.Sprintf("memory: [%d,+%d) outside region of %d bytes", h.Offset, h.Length, size))
		case h.Op == protocol.OpRead:
			rh.Payload = h.Length
			rh.Encode(out[:])
			err = p.SendV([][]byte{out[:], mem[h.Offset : h.Offset+uint64(h.Length)]})
		case h.Op == protocol.OpWrite:
			mv, ok := s.reg.writeGate(w.quit)
			if !ok {
				// Moved (RetireRegion): the write is refused, the
				// session ends.
				if discard(h.Length) == nil {
					_ = fail(h, protocol.StatusGone, errRetired.Error())
				}
				s.reg.writeRefused(mv)
				return
			}
			if h.Length > 0 {
				w.begin(mv)
				err = w.recv(p, mem[h.Offset:h.Offset+uint64(h.Length)])
				w.end()
			}
			s.reg.writeDone(mv, h.Offset, uint64(h.Length))
			if err != nil {
				return
			}
			rh.Encode(out[:])
			err = p.SendV([][]byte{out[:]})
		}
		if err != nil {
			return
		}
	}
}
