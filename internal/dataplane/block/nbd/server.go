package nbd

import (
	"container/list"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/accept"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"github.com/rialto-project/rialto/internal/dataplane/tlspsk"
)

// Backend is the storage behind an export. ReadAt and WriteAt must be safe
// for concurrent use. Flush makes every completed write durable, whichever
// connection issued it.
type Backend interface {
	io.ReaderAt
	io.WriterAt
	Size() int64
	Flush() error
}

// Trimmer is implemented by backends that can discard a range
// (NBD_CMD_TRIM). Without it the export does not advertise trim.
type Trimmer interface {
	Trim(off, n int64) error
}

// Zeroer is implemented by backends that can zero a range efficiently
// (NBD_CMD_WRITE_ZEROES). noHole asks that the range stay allocated.
// Without it the server writes zero buffers.
type Zeroer interface {
	WriteZeroes(off, n int64, noHole bool) error
}

// Extenter is implemented by backends that know which ranges are holes
// (base:allocation). Without it every range is reported as allocated data.
// Extents may return fewer bytes than n but must cover at least one byte and
// must never call data a hole.
type Extenter interface {
	Extents(off, n int64) ([]Extent, error)
}

// FUAWriter is implemented by backends that can make one write durable more
// cheaply than WriteAt followed by Flush.
type FUAWriter interface {
	WriteAtFUA(p []byte, off int64) (int, error)
}

// FUAFlusher is implemented by backends whose flush after a FUA request
// (TRIM, WRITE_ZEROES, or a write without WriteAtFUA) must differ from
// NBD_CMD_FLUSH's: a write-back cache's FLUSH reports an earlier
// acknowledged write's failure (once), which a FUA request, answering for
// itself only, must leave to the next FLUSH.
type FUAFlusher interface {
	FlushFUA() error
}

// ReadStarter is implemented by backends whose reads are requests to
// another server (`rialto attach`'s volume): StartReadAt sends the read and
// returns at once, and done is called once, from whichever goroutine reads
// the reply, with nil once p holds the bytes or with the error ReadAt
// would have returned; done does not block. It returns false, and never
// calls done, when this read cannot be started so (a failed part, write-
// back overlaps): the connection then serves it through ReadAt. At queue
// depth above 1 a connection starts such reads from its reader goroutine
// and sends their replies from a goroutine of its own, with no worker in
// between (docs/composition.md, "The attach data path and what it costs").
type ReadStarter interface {
	StartReadAt(p []byte, off int64, done func(error)) bool
}

// WriteStarter is ReadStarter for writes without FUA: StartWriteAt sends the
// write of p (untouched until done) and done gets what WriteAt would have
// returned as error, once the write is as complete as WriteAt's return
// would have made it (a FLUSH received after the reply covers it).
type WriteStarter interface {
	StartWriteAt(p []byte, off int64, done func(error)) bool
}

// ReplyWatcher is implemented by an error a backend returns that must
// learn whether its client was told: a report the backend hands out once
// (a flush's report of lost writes, Linux's errseq) and must hand out
// again if the reply carrying it is lost with its connection. The server
// calls ReplySent once, with true when the reply carrying the error has
// been written whole to the client's socket, or with false when it cannot
// say so: the connection ended first, or a send of the replies failed. A
// failed send (of up to maxBatch replies) counts every reply it carried
// as not sent, though it may have written some of them whole before it
// failed: false may come for a reply that was written, never true for
// one that was not. A report handed out once is thus handed out again at
// worst. It must not block.
type ReplyWatcher interface {
	ReplySent(sent bool)
}

// MultiConnSafer lets a backend veto NBD_FLAG_CAN_MULTI_CONN, which is
// advertised by default because Backend.Flush is global by contract.
type MultiConnSafer interface {
	MultiConnSafe() bool
}

// Export is one named block device served by a Server.
type Export struct {
	// Name is what the client asks for. Names are lease credentials: they
	// are never listed or logged.
	Name string
	// Description is sent on NBD_INFO_DESCRIPTION; it must not be secret.
	Description string
	Backend     Backend
	ReadOnly    bool
	// Block size constraints; zero means the defaults (1, 4096, 32 MiB).
	// MinBlock and PrefBlock must be powers of two, MaxBlock a multiple of
	// MinBlock, and the backend size a multiple of MinBlock.
	MinBlock, PrefBlock, MaxBlock uint32
	// Limit optionally caps bandwidth and IOPS over all connections.
	Limit *RateLimit
	// Counters, if set, counts the bytes of the reads and writes the
	// export served, over all connections (the agent reports them).
	Counters *IOCounters
	// Deadline, if set, is when the export stops being served (a lease's
	// known expiry, which may move): a request that arrives once it has
	// passed, or that a worker would start after it, is answered
	// ESHUTDOWN without reaching the backend, whether or not the export
	// has been suspended or removed yet. It is checked when the request
	// is read and again when a worker takes it (once per group of
	// requests), so nothing is started on the backend after it.
	Deadline *clock.Deadline
}

// IOCounters counts the bytes an export's successful reads and writes
// moved. The zero value is ready; it is safe for concurrent use.
type IOCounters struct {
	Read, Written atomic.Int64
}

// NameTag returns a short non-reversible tag of an export name for logs.
func NameTag(name string) string {
	h := sha256.Sum256([]byte(name))
	return hex.EncodeToString(h[:4])
}

type export struct {
	Export
	size  int64
	conns map[*conn]struct{}

	// A move of the export (move.go): its state, and the writes under
	// way that started without seeing one.
	writes dirty.Writes // a move's write gate (move.go)
	// suspended: kept, with its move, but not served (suspend.go);
	// s.mu guards it.
	suspended bool
}

func (e *export) transmissionFlags(structured bool) uint16 {
	f := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendWriteZeroes
	if e.ReadOnly {
		f |= FlagReadOnly
	}
	if _, ok := e.Backend.(Trimmer); ok && !e.ReadOnly {
		f |= FlagSendTrim
	}
	if structured {
		f |= FlagSendDF
	}
	mc := true
	if m, ok := e.Backend.(MultiConnSafer); ok {
		mc = m.MultiConnSafe()
	}
	if mc {
		f |= FlagCanMultiConn
	}
	return f
}

// Server serves NBD exports. The zero value is ready to use.
type Server struct {
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
	// Workers bounds the requests served concurrently per connection
	// (default 16).
	Workers int
	// HandshakeTimeout bounds the option phase (default 30s), TLS
	// handshake included.
	HandshakeTimeout time.Duration
	// TLSConfig enables NBD_OPT_STARTTLS (it needs a certificate). nil
	// serves plaintext only: STARTTLS is refused with NBD_REP_ERR_POLICY.
	TLSConfig *tls.Config
	// TLSOptional lets clients that do not send STARTTLS use the exports
	// in plaintext. By default a server with a TLSConfig requires TLS:
	// before STARTTLS every option but STARTTLS and ABORT is answered
	// NBD_REP_ERR_TLS_REQD and NBD_OPT_EXPORT_NAME ends the connection.
	TLSOptional bool
	// PSK, if it holds keys, also offers TLS 1.3 with a pre-shared key
	// (nbdkit's --tls-psk, libnbd's tls-psk-file): a client whose
	// ClientHello offers one of its identities is authenticated by that
	// key instead of TLSConfig's certificate (package tlspsk). With PSK
	// and no TLSConfig the server offers STARTTLS with PSK only. Either
	// way export names are still the credentials checked.
	PSK *tlspsk.Keys
	// MoveWait bounds how long TrackWrites and PauseWrites wait for a
	// write under way that started without seeing the move and receives
	// none of its payload: such a write (spliced, or read or decrypted
	// into a mapping) is under way from its header on, while its payload
	// arrives, and a client may withhold the payload. Its connection is
	// closed then (only it). Zero means DefaultMoveWait.
	MoveWait time.Duration
	// MoveWaitLimit bounds how long TrackWrites and PauseWrites wait for
	// such writes whose payload keeps arriving, however slowly: their
	// connections are closed then. Zero means DefaultMoveWaitLimit.
	MoveWaitLimit time.Duration
	// Clock times MoveWait and MoveWaitLimit (internal/clock); nil: the
	// real clock.
	Clock clock.Clock
	// MovePending bounds the payload bytes of the writes to a moving
	// export that the server has taken in and not yet written (held by
	// PauseWrites, or on their way to the backend), over all the
	// export's connections: past it a connection's reader waits before it
	// reads the next write's payload (the client's sends wait), until
	// enough are written or refused, or the connection ends. Zero means
	// DefaultMovePending; less than zero, no bound (each connection's
	// own 64 MiB still holds).
	MovePending int64
	// MaxExportConns bounds the connections one export serves at once:
	// each may hold up to 64 MiB of request payloads and read replies
	// (a client that sends large reads and never reads its socket keeps
	// them), so one tenant's connections would otherwise hold as much
	// memory as they are many. A client asking for an export that has as
	// many is refused at NBD_OPT_GO with NBD_REP_ERR_POLICY and a message
	// (at NBD_OPT_EXPORT_NAME, which has no error reply, the server hangs
	// up); it may try again once one has ended. Zero means
	// DefaultMaxExportConns; less than zero, no bound.
	MaxExportConns int
	// MaxHandshakes bounds the connections in the option phase at once,
	// TLS handshake included: peers that have presented no export name
	// (no credential) yet. Each holds little (a 4 KiB read buffer, the
	// option data, at most 16 KiB, TLS state) but for up to
	// HandshakeTimeout. At the bound, Serve closes the connection that
	// has been in its option phase longest before it starts the next
	// one's, so that peers holding their handshakes open cannot keep a
	// client that completes its own promptly out; ServeConn does the
	// same. Zero means DefaultMaxHandshakes; less than zero, no bound.
	// The connection closed is the oldest of the source (below) that has
	// the most connections in their option phase, so that one peer's
	// stalled handshakes push out its own, not a client's from
	// elsewhere on a slow link.
	MaxHandshakes int
	// MaxHandshakesPerSource bounds the connections in the option phase
	// at once from one source: an IPv4 address, or an IPv6 /64 (peers
	// without an IP address, on a Unix socket, are not bounded so). A
	// connection from a source that has as many has that source's
	// connection longest in its option phase closed first, as at
	// MaxHandshakes. Zero means DefaultMaxHandshakesPerSource; less than
	// zero, no bound.
	MaxHandshakesPerSource int

	mu      sync.Mutex
	exports map[string]*export

	hs handshakes

	// testHookAbandoned, if set, runs when a connection's reader has
	// ended without a disconnect and its queued requests are abandoned.
	testHookAbandoned func()
	// testHookBlocked, if set, runs when a connection's reader is about
	// to wait for something other than its socket (a worker, payload
	// budget, the socket's writer).
	testHookBlocked func(*conn)
	// testHookDisc, if set, runs when a connection's reader has read
	// NBD_CMD_DISC, before it sends the replies it holds.
	testHookDisc func(*conn)
	// testHookGroup, if set, runs when a worker takes up a group of
	// requests, before it checks the export's deadline.
	testHookGroup func()
	// testHookEnded, if set, runs when a connection's reader has ended
	// and abandoned says whether it ended without NBD_CMD_DISC.
	testHookEnded func()
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func isPow2(v uint32) bool { return v != 0 && v&(v-1) == 0 }

// AddExport registers an export. Its name must be unused.
func (s *Server) AddExport(e Export) error {
	return s.addExport(e, false)
}

// addExport is AddExport; suspended registers the export suspended
// (AddSuspendedExport).
func (s *Server) addExport(e Export, suspended bool) error {
	if e.Backend == nil {
		return fmt.Errorf("%w: nil backend", ErrInvalidExport)
	}
	if len(e.Name) > maxNameLen || len(e.Description) > maxNameLen {
		return fmt.Errorf("%w: name or description longer than %d bytes", ErrInvalidExport, maxNameLen)
	}
	if e.MinBlock == 0 {
		e.MinBlock = DefaultMinBlock
	}
	if e.PrefBlock == 0 {
		e.PrefBlock = max(DefaultPrefBlock, e.MinBlock)
	}
	if e.MaxBlock == 0 {
		e.MaxBlock = DefaultMaxBlock
	}
	if !isPow2(e.MinBlock) || e.MinBlock > 64<<10 || !isPow2(e.PrefBlock) || e.PrefBlock < e.MinBlock ||
		e.MaxBlock%e.MinBlock != 0 || e.MaxBlock < e.PrefBlock || e.MaxBlock > DefaultMaxBlock {
		return fmt.Errorf("%w: bad block sizes %d/%d/%d", ErrInvalidExport, e.MinBlock, e.PrefBlock, e.MaxBlock)
	}
	size := e.Backend.Size()
	if size < 0 || size%int64(e.MinBlock) != 0 {
		return fmt.Errorf("%w: size %d is not a multiple of the minimum block size %d", ErrInvalidExport, size, e.MinBlock)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exports == nil {
		s.exports = make(map[string]*export)
	}
	if _, ok := s.exports[e.Name]; ok {
		return ErrExportExists
	}
	s.exports[e.Name] = &export{Export: e, size: size, conns: make(map[*conn]struct{}), suspended: suspended}
	s.logger().Info("nbd: export added", "export", NameTag(e.Name), "size", size, "readonly", e.ReadOnly, "suspended", suspended)
	return nil
}

// RemoveExport unregisters an export, closes its connections and waits
// until they have stopped: once it returns, no request of theirs (even one
// already read, waiting on the rate limit or for a worker) reaches the
// backend, which may then serve another lease.
func (s *Server) RemoveExport(name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	if !ok {
		s.mu.Unlock()
		return ErrExportNotFound
	}
	delete(s.exports, name)
	conns := e.connList()
	s.mu.Unlock()
	endConns(conns)
	s.logger().Info("nbd: export removed", "export", NameTag(name), "connections", len(conns))
	return nil
}

// connList lists e's connections; the server's mu is held.
func (e *export) connList() []*conn {
	conns := make([]*conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	return conns
}

// endConns ends conns at once (requests under way are abandoned, no
// reply goes out) and waits for them.
func endConns(conns []*conn) {
	for _, c := range conns {
		c.cancel()
		c.nc.Close()
	}
	for _, c := range conns {
		<-c.done
	}
}

// lookup returns the export a client may open as name (nil for an
// unknown or suspended one).
func (s *Server) lookup(name string) *export {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.exports[name]; e != nil && !e.suspended {
		return e
	}
	return nil
}

// attach registers c with the export named name, if it still exists and
// is not suspended.
func (s *Server) attach(name string, c *conn) *export {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.exports[name]
	if e == nil || e.suspended {
		return nil
	}
	if m := s.maxExportConns(); m > 0 && len(e.conns) >= m {
		// Others won the race since the option phase checked.
		return nil
	}
	e.conns[c] = struct{}{}
	return e
}

// DefaultMaxExportConns is Server.MaxExportConns's default: above the
// connections a multi-conn client opens (nbdcopy's 4, fio jobs of 32 to
// 64), far below what would let one tenant hold the agent's memory (each
// connection up to 64 MiB of buffers).
const DefaultMaxExportConns = 64

func (s *Server) maxExportConns() int {
	switch {
	case s.MaxExportConns > 0:
		return s.MaxExportConns
	case s.MaxExportConns < 0:
		return 0 // no bound
	}
	return DefaultMaxExportConns
}

// exportFull reports whether e has as many connections as it may.
func (s *Server) exportFull(e *export) bool {
	m := s.maxExportConns()
	if m == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(e.conns) >= m
}

func (s *Server) detach(e *export, c *conn) {
	s.mu.Lock()
	delete(e.conns, c)
	s.mu.Unlock()
}

// Serve accepts connections on ln until ctx is done, then closes ln and every
// connection it accepted, waits for their goroutines and returns nil. It
// returns earlier with an error if Accept fails permanently; a timeout or
// a shortage of descriptors or memory is retried (internal/accept).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var retry accept.Backoff
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// A timeout, or out of descriptors or memory for now: the
			// connection waits in the backlog; the exports served go on.
			if retry.Retry(ctx, err, s.logger()) {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("nbd: accept: %w", err)
		}
		retry.Reset()
		hs, ok := s.hs.start(ctx, s.maxHandshakes(), s.maxHandshakesPerSource(), nc)
		if !ok {
			nc.Close()
			return nil // ctx is done
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, nc, hs)
		}()
	}
}

// ServeConn serves one already-accepted connection until it ends or ctx is
// done. It closes nc.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) {
	hs, ok := s.hs.start(ctx, s.maxHandshakes(), s.maxHandshakesPerSource(), nc)
	if !ok {
		nc.Close()
		return
	}
	s.serveConn(ctx, nc, hs)
}

// serveConn serves nc, whose option phase holds hs (handshakes.start).
func (s *Server) serveConn(ctx context.Context, nc net.Conn, hs *list.Element) {
	hsDone := sync.OnceFunc(func() { s.hs.end(hs) })
	defer hsDone()
	// done is closed last, once the socket is closed too: RemoveExport
	// waits for it.
	done := make(chan struct{})
	defer close(done)
	defer nc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	log := s.logger().With("remote", nc.RemoteAddr().String())
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	ht := s.HandshakeTimeout
	if ht <= 0 {
		ht = 30 * time.Second
	}
	nc.SetDeadline(time.Now().Add(ht))
	sr := newSocketReader(nc)
	r := newHandshakeReader(sr)
	// TLS, if the client starts it, reads the socket through sr too, and
	// writes it through sc, whose socket changes to the raw one below.
	sc := &readerConn{Conn: nc, r: sr}
	sess, err := s.negotiate(sc, r)
	hsDone()
	if err != nil {
		if !errors.Is(err, errAbort) {
			log.Debug("nbd: handshake ended", "err", err)
		}
		return
	}
	nc.SetDeadline(time.Time{})
	// The transmission phase's larger buffer, now that the client has
	// presented an export name.
	switch {
	case sess.psk != nil:
		sess.r = transmissionReader(sess.r, sess.psk)
	case sess.tls != nil:
		sess.r = transmissionReader(sess.r, sess.tls)
	default:
		sess.r = transmissionReader(sess.r, sr)
	}
	r = sess.r
	var c *conn
	fr, _ := sr.(*fastReader)
	var rs *rawSock
	if fr != nil {
		// Take the socket out of the netpoller (rawsock.go), TLS or
		// not; the reader's buffer (and, over TLS, the record reader's
		// and crypto/tls's) keeps what it has read ahead.
		rs, err = newRawSock(nc)
		if err != nil {
			log.Debug("nbd: connection ended", "export", NameTag(sess.name), "err", err)
			return
		}
		// After the connection's goroutines have ended (and close_notify).
		defer func() {
			if ctx.Err() != nil {
				// Ended by the server (RemoveExport, Retire's
				// deadline, Serve's end): reset, so that the
				// socket does not keep sending once RemoveExport
				// has returned. Bytes a reply sent with sendfile
				// are referenced, not copied: still queued, they
				// would be read from the page cache when they
				// leave, after the agent has wiped the range or
				// the next lease has written it.
				rs.abort()
			}
			rs.release()
		}()
		stopRS := context.AfterFunc(ctx, func() { rs.Close() })
		defer stopRS()
		fr.rc, fr.rs = sockRC{rs}, rs
		sc.Conn = rs // crypto/tls's writes
	}
	switch {
	case sess.psk != nil || sess.tls != nil:
		// Over TLS the bytes pass through crypto/tls (or, with a
		// pre-shared key, package tlspsk): no raw-socket paths
		// (sendfile, splice, mapped writev), but the TLS layer reads the
		// socket through the polling reader and writes it with the raw
		// socket's system calls.
		raw := nc
		if rs != nil {
			raw = rs
		}
		var ec interface {
			net.Conn
			closeNotify(time.Duration)
		}
		// Replies still queued when the session ends must not be reset
		// away by a close_notify the reader has not read (endSession).
		if sess.psk != nil {
			ec = &pskConn{Conn: sess.psk, raw: raw, drain: true}
		} else {
			tc := newTLSConn(sess.tls, raw)
			tc.drain = true
			ec = tc
		}
		defer ec.closeNotify(time.Second)
		c = newConn(s, ec, sess.r, sess)
		// queuedBehind asks the socket under TLS too.
		if rs != nil {
			if rs.tcp {
				c.sock = sockRC{rs}
			}
		} else if t, ok := nc.(*net.TCPConn); ok {
			c.sock, _ = t.SyscallConn()
		}
		if sess.rec != nil {
			// Replies the reader holds leave before it waits on the socket.
			sess.rec.wait = c.flushBatch
			// A move waiting for a write sees its payload arrive
			// (move.go), a partial record's bytes too.
			sess.rec.got = &c.recv
		}
	case rs != nil:
		c = newConn(s, rs, r, sess)
		c.sock = sockRC{rs} // queuedBehind
	default:
		c = newConn(s, nc, r, sess)
	}
	if fr != nil {
		// At queue depth 1 the reader waits in poll(2) on the raw
		// socket, TLS or not (fastReader).
		c.fr = fr
	}
	c.cancel, c.done = cancel, done
	// The socket, whose end of the client's stream the workers look for
	// while the reader waits for them (abandon.go).
	if rs != nil {
		c.peer = sockRC{rs}
	} else {
		c.peer = peerConn(nc)
	}
	e := s.attach(sess.name, c)
	if e != sess.exp {
		if e != nil {
			s.detach(e, c)
		}
		return // removed (or replaced) during the handshake
	}
	defer s.detach(e, c)
	if sess.psk != nil {
		// The identity (not a secret: it crosses the wire in clear) tells
		// an operator rotating keys who still uses an old one.
		log = log.With("psk_identity", sess.psk.Identity())
	}
	log.Debug("nbd: transmission", "export", NameTag(sess.name), "structured", sess.structured, "tls", sess.tls != nil, "psk", sess.psk != nil)
	if err := c.serve(ctx); err != nil {
		log.Debug("nbd: connection ended", "export", NameTag(sess.name), "err", err)
	}
}
