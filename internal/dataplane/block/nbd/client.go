package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/internal/pki"
)

// DefaultRequestTimeout bounds every Client request unless WithRequestTimeout
// says otherwise.
const DefaultRequestTimeout = 30 * time.Second

type dialOptions struct {
	timeout      time.Duration
	noStructured bool
	tls          *tls.Config
	track        pki.TrackFunc
}

// DialOption configures Dial.
type DialOption func(*dialOptions)

// minHandshakeTimeout is the least time the handshake is given, however short
// the request timeout.
const minHandshakeTimeout = 5 * time.Second

// WithRequestTimeout bounds each request (and the handshake, which gets at
// least 5 s unless Dial's ctx says otherwise). When a request
// exceeds it the connection is considered dead: it is closed and every pending
// request fails with ErrTimeout. d <= 0 disables the bound (not recommended).
func WithRequestTimeout(d time.Duration) DialOption {
	return func(o *dialOptions) { o.timeout = d }
}

// WithTLS makes the client send NBD_OPT_STARTTLS before any other option
// and run TLS with cfg; a server that refuses is not used in plaintext (no
// downgrade). An empty cfg.ServerName is taken from the host dialled
// ("localhost" for a Unix socket).
func WithTLS(cfg *tls.Config) DialOption {
	return func(o *dialOptions) { o.tls = cfg }
}

// WithTrack hands track each TLS connection the client makes, once its
// handshake is done (the server's certificate), with the function that
// ends it: a revocation list's Tracker (pki.CRL.Tracker,
// pki.Roots.Tracker) ends the connection when a list it takes later
// revokes the server's certificate. Pending and later requests then fail
// with ErrClosed, wrapping why (pki.ErrRevoked). A connection track
// refuses (a list taken since the handshake revokes the server) fails
// the dial as a failed handshake does; one a list ends before Dial
// returns fails the dial with ErrClosed, wrapping why. Connections in
// plaintext are not handed.
func WithTrack(track pki.TrackFunc) DialOption {
	return func(o *dialOptions) { o.track = track }
}

// WithoutStructuredReplies makes the client use simple replies only.
func WithoutStructuredReplies() DialOption {
	return func(o *dialOptions) { o.noStructured = true }
}

// Client is an NBD client connection to one export. Its methods are safe for
// concurrent use; requests are pipelined and matched by handle. A Client is a
// Backend, Trimmer and Zeroer, so it can be re-exported or composed.
type Client struct {
	nc         net.Conn
	size       int64
	flags      uint16
	minBlock   uint32
	prefBlock  uint32
	maxBlock   uint32
	structured bool
	meta       bool   // base:allocation negotiated
	metaID     uint32 // its context id
	timeout    time.Duration

	// Requests are written by whoever finds no write under way: callers
	// queue their request under wmu, and the one that finds flushing
	// false writes the queue, and whatever others queued meanwhile, with
	// one writev per round (see send).
	wmu      sync.Mutex
	wq       writeQueue // requests waiting to be written, guarded by wmu
	wspare   writeQueue // the flusher's other queue, guarded by wmu
	flushing bool       // a caller is writing, guarded by wmu
	werr     error      // the first failed write's error, guarded by wmu: nothing is written after it
	// wsince is when the write under way began (monoNow), 0 when none
	// is: the watchdog bounds a write as it bounds a request, since a
	// write can stall with every request answered (a server that replied
	// before reading a payload, then stopped reading).
	wsince atomic.Int64

	mu      sync.Mutex
	pending map[uint64]*call
	handle  uint64
	err     error // terminal error, set once
	shut    bool  // the server answered ESHUTDOWN: disconnect softly
	// reading says that someone owns br: a caller waiting for its own
	// reply, or the background reader (see doCall).
	reading bool
	// closing says that the socket has been closed (fail, Close): nobody
	// may start reading, and whoever reads fails the pending calls.
	closing bool

	br   *bufio.Reader             // replies; read only by whoever owns reading
	hdr  [structuredHeaderLen]byte // receiveOne's, used only by whoever owns reading
	rawc syscall.RawConn           // the TCP socket, nil with TLS or Unix sockets
	// rs is the plaintext socket once it has left the netpoller
	// (clientraw.go), nil with TLS. Whoever makes a system call on it
	// holds rsMu for reading; Close releases its descriptor with rsMu
	// held for writing, so no call reaches a reused descriptor number.
	rs         *rawSock
	rsMu       sync.RWMutex
	wake       chan struct{} // hands reading to the background reader
	dead       chan struct{} // closed once the connection has failed
	deadOnce   sync.Once
	readerDone chan struct{} // closed when the background reader has stopped
	wdDone     chan struct{} // closed when the watchdog has stopped
	// untrack, if set, takes the connection off the list of live TLS
	// connections WithTrack's function keeps, once it is dead. Guarded
	// by mu: set by Dial once registered, unless the connection ended
	// already.
	untrack func()
}

// writeQueue is requests waiting to be written: their headers back to
// back in hdrs, each with its payload (nil for none).
type writeQueue struct {
	hdrs     []byte
	payloads [][]byte
	iov      net.Buffers
	out      net.Buffers // what is left of iov to write (writeBuffers consumes it)
}

func (q *writeQueue) reset() {
	q.hdrs = q.hdrs[:0]
	clear(q.payloads) // the callers' buffers are theirs again
	q.payloads = q.payloads[:0]
	clear(q.iov)
	q.iov = q.iov[:0]
	q.out = nil
}

// buffers returns q's requests as one gather list: runs of headers
// without payload are one entry.
func (q *writeQueue) buffers() net.Buffers {
	start := 0
	for i, p := range q.payloads {
		if p == nil {
			continue
		}
		end := (i + 1) * requestHeaderLen
		q.iov = append(q.iov, q.hdrs[start:end], p)
		start = end
	}
	if start < len(q.hdrs) {
		q.iov = append(q.iov, q.hdrs[start:])
	}
	return q.iov
}

type call struct {
	typ      uint16
	off      uint64
	deadline int64  // on the monotonic clock (monoNow); 0: none
	buf      []byte // read destination
	got      int
	ext      []Extent     // block-status reply
	state    atomic.Int32 // callLive, callReceiving, callAbandoned
	err      error
	done     chan struct{}
	// completed is set (under Client.mu) when the reply is complete.
	completed bool
	// onDone, if set (StartWrite, StartRead), is called once with err when the
	// call completes or fails, by whoever completes it, after done is
	// closed. It must not block.
	onDone func(error)
}

const (
	callLive int32 = iota
	callReceiving
	callAbandoned
)

// URI is a parsed NBD URI.
type URI struct {
	Network string // "tcp" or "unix"
	Address string // host:port or socket path
	Export  string
	// TLS is set by the nbds and nbds+unix schemes.
	TLS bool
	// TLSCertificates is the tls-certificates query parameter of an nbds
	// URI: a directory in libnbd's layout (see LoadTLSDir).
	TLSCertificates string
	// ServerName, if set, is the name the server's certificate must carry
	// when it is not the host dialled (a caller that resolved a host name
	// to the address it dials). It is not part of the URI's text.
	ServerName string
}

// ParseURI parses nbd://host[:port]/export, nbd+unix:///export?socket=PATH
// and their TLS forms nbds:// and nbds+unix:// (with the libnbd query
// parameter tls-certificates=DIR).
func ParseURI(s string) (URI, error) {
	return parseURI(s)
}

// DialURI dials the export a URI names. An nbds URI uses TLS: with the
// configuration of WithTLS if given, else with the certificates of its
// tls-certificates directory (see LoadTLSDir), else trusting the system's
// CAs.
func DialURI(ctx context.Context, uri string, opts ...DialOption) (*Client, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	if !u.TLS {
		return Dial(ctx, u.Network, u.Address, u.Export, opts...)
	}
	var o dialOptions
	for _, f := range opts {
		f(&o)
	}
	return u.Dial(ctx, o.tls, opts...)
}

// Dial dials the export u names. An nbds URI uses TLS with tlsCfg if it is
// not nil, else with the certificates of its tls-certificates directory
// (see LoadTLSDir), else trusting the system's CAs; the server's
// certificate must name u.ServerName if set, else the host dialled. A
// plaintext URI ignores tlsCfg: whether a connection is encrypted is the
// URI's to say (the lease's, as the control plane handed it out), so one
// configuration serves every part of a volume. WithTLS among opts is
// overridden.
func (u URI) Dial(ctx context.Context, tlsCfg *tls.Config, opts ...DialOption) (*Client, error) {
	if !u.TLS {
		return Dial(ctx, u.Network, u.Address, u.Export, append(opts, WithTLS(nil))...)
	}
	cfg := tlsCfg
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if u.TLSCertificates != "" {
			var err error
			if cfg, err = LoadTLSDir(u.TLSCertificates); err != nil {
				return nil, err
			}
		}
	}
	if u.ServerName != "" && cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = u.ServerName
	}
	return Dial(ctx, u.Network, u.Address, u.Export, append(opts, WithTLS(cfg))...)
}

// Dial connects to export on an NBD server, negotiates fixed newstyle,
// structured replies and NBD_OPT_GO, and returns a Client in transmission
// phase. ctx bounds the connection and handshake only.
func Dial(ctx context.Context, network, addr, export string, opts ...DialOption) (*Client, error) {
	o := dialOptions{timeout: DefaultRequestTimeout}
	for _, f := range opts {
		f(&o)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("nbd: dial: %w", err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	dl, ok := ctx.Deadline()
	if hs := max(o.timeout, minHandshakeTimeout); o.timeout > 0 && (!ok || time.Until(dl) > hs) {
		dl = time.Now().Add(hs)
	}
	nc.SetDeadline(dl)
	tcfg := o.tls
	if tcfg != nil && tcfg.ServerName == "" {
		tcfg = tcfg.Clone()
		tcfg.ServerName = "localhost"
		if host, _, err := net.SplitHostPort(addr); err == nil && network != "unix" {
			tcfg.ServerName = host
		}
	}
	c := newClient(nc, o.timeout)
	br, err := c.handshake(bufio.NewReaderSize(nc, 64<<10), export, !o.noStructured, tcfg)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("nbd: handshake: %w", ctx.Err())
		}
		return nil, err
	}
	if t, ok := c.nc.(*tlsConn); ok && o.track != nil {
		untrack, err := o.track(addr, t.ConnectionState(), c.end)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("nbd: TLS handshake: %w", err)
		}
		// Once registered, a list taken meanwhile may have ended the
		// connection already (c.end, from another goroutine's
		// CRL.Update or SetRoots): then failPending found no untrack
		// to call, and the client is dead before it is handed out.
		c.mu.Lock()
		ended, err := c.closing, c.err
		if !ended {
			c.untrack = untrack
		}
		c.mu.Unlock()
		if ended {
			untrack()
			nc.Close()
			if err == nil {
				err = ErrClosed
			}
			return nil, err
		}
	}
	nc.SetDeadline(time.Time{})
	c.br = br
	if tc, ok := c.nc.(*net.TCPConn); ok { // not TLS
		c.rawc, _ = tc.SyscallConn()
	}
	c.leaveNetpoller()
	go c.background()
	go c.watchdog()
	return c, nil
}

func newClient(nc net.Conn, timeout time.Duration) *Client {
	return &Client{nc: nc, timeout: timeout, pending: make(map[uint64]*call),
		wake: make(chan struct{}, 1), dead: make(chan struct{}), readerDone: make(chan struct{}),
		wdDone: make(chan struct{})}
}

// monoBase anchors monoNow.
var monoBase = time.Now()

// monoNow is the time on the monotonic clock, in nanoseconds since
// monoBase (never 0 once the process has run a nanosecond).
func monoNow() int64 { return int64(time.Since(monoBase)) + 1 }

// watchdogPeriod is how often the watchdog of a client with request
// timeout d looks for requests that have exceeded it: a request that
// does fails between d and d plus this.
func watchdogPeriod(d time.Duration) time.Duration {
	return min(max(d/4, time.Millisecond), time.Second)
}

// watchdog enforces the request timeout for every pending request, and
// for the write under way, with one ticker per connection, instead of a
// timer per request (arming and stopping a runtime timer, and resetting
// the socket's write deadline, per request cost `rialto attach` a few per
// cent of its CPU). A request or a write past the timeout fails the
// connection with ErrTimeout, as a timer would have. It stops when the
// connection has failed or closed.
func (c *Client) watchdog() {
	defer close(c.wdDone)
	if c.timeout <= 0 {
		return
	}
	t := time.NewTicker(watchdogPeriod(c.timeout))
	defer t.Stop()
	for {
		select {
		case <-c.dead:
			return
		case <-t.C:
		}
		now := monoNow()
		w := c.wsince.Load()
		late := w != 0 && now-w > int64(c.timeout)
		c.mu.Lock()
		for _, cl := range c.pending {
			if cl.deadline != 0 && now > cl.deadline {
				late = true
				break
			}
		}
		c.mu.Unlock()
		if late {
			c.fail(ErrTimeout)
			return
		}
	}
}

// handshake runs the client side of the option phase, upgrading to TLS
// first when tcfg is set; it returns the reader to continue with.
func (c *Client) handshake(r *bufio.Reader, export string, structured bool, tcfg *tls.Config) (*bufio.Reader, error) {
	var b [18]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return nil, fmt.Errorf("nbd: handshake: %w", err)
	}
	if binary.BigEndian.Uint64(b[0:]) != nbdMagic || binary.BigEndian.Uint64(b[8:]) != optMagic {
		return nil, fmt.Errorf("%w: not a newstyle NBD server", ErrProtocol)
	}
	sflags := binary.BigEndian.Uint16(b[16:])
	if sflags&flagFixedNewstyle == 0 {
		return nil, fmt.Errorf("%w: server lacks fixed newstyle", ErrProtocol)
	}
	cflags := clientFlagFixedNewstyle
	noZeroes := sflags&flagNoZeroes != 0
	if noZeroes {
		cflags |= clientFlagNoZeroes
	}
	var cf [4]byte
	binary.BigEndian.PutUint32(cf[:], cflags)
	if _, err := c.nc.Write(cf[:]); err != nil {
		return nil, fmt.Errorf("nbd: handshake: %w", err)
	}
	if tcfg != nil {
		var err error
		if r, err = c.startTLS(r, tcfg); err != nil {
			return nil, err
		}
	}
	if structured {
		if err := c.sendOpt(optStructuredReply, nil); err != nil {
			return nil, err
		}
		typ, _, err := c.readOptReply(r, optStructuredReply)
		if err != nil {
			return nil, err
		}
		if typ == repErrTLSReqd {
			return nil, ErrTLSRequired
		}
		c.structured = typ == repAck
	}
	if c.structured {
		if err := c.setMetaContext(r, export); err != nil {
			return nil, err
		}
	}
	req := make([]byte, 0, 8+len(export))
	req = binary.BigEndian.AppendUint32(req, uint32(len(export)))
	req = append(req, export...)
	req = binary.BigEndian.AppendUint16(req, 1)
	req = binary.BigEndian.AppendUint16(req, infoBlockSize)
	if err := c.sendOpt(optGo, req); err != nil {
		return nil, err
	}
	gotExport := false
	for {
		typ, data, err := c.readOptReply(r, optGo)
		if err != nil {
			return nil, err
		}
		switch {
		case typ == repInfo:
			if len(data) < 2 {
				return nil, fmt.Errorf("%w: short NBD_REP_INFO", ErrProtocol)
			}
			switch binary.BigEndian.Uint16(data) {
			case infoExport:
				if len(data) != 12 {
					return nil, fmt.Errorf("%w: bad NBD_INFO_EXPORT", ErrProtocol)
				}
				size := binary.BigEndian.Uint64(data[2:])
				if size > math.MaxInt64 {
					return nil, fmt.Errorf("%w: export size %d too large", ErrProtocol, size)
				}
				c.size = int64(size)
				c.flags = binary.BigEndian.Uint16(data[10:])
				gotExport = true
			case infoBlockSize:
				if len(data) != 14 {
					return nil, fmt.Errorf("%w: bad NBD_INFO_BLOCK_SIZE", ErrProtocol)
				}
				c.minBlock = binary.BigEndian.Uint32(data[2:])
				c.prefBlock = binary.BigEndian.Uint32(data[6:])
				c.maxBlock = binary.BigEndian.Uint32(data[10:])
			}
		case typ == repAck:
			if !gotExport {
				return nil, fmt.Errorf("%w: NBD_OPT_GO without NBD_INFO_EXPORT", ErrProtocol)
			}
			c.fixBlockSizes()
			return r, nil
		case typ == repErrUnknown:
			return nil, ErrExportNotFound
		case typ == repErrTLSReqd:
			return nil, ErrTLSRequired
		case typ == repErrUnsup:
			return r, c.exportName(r, export, noZeroes)
		case typ&repErrBit != 0:
			return nil, fmt.Errorf("nbd: server refused the export: %s", optErrName(typ, data))
		default:
			return nil, fmt.Errorf("%w: unexpected option reply %#x", ErrProtocol, typ)
		}
	}
}

// startTLS upgrades the connection with NBD_OPT_STARTTLS, the first option
// sent, and returns a reader over the TLS connection.
func (c *Client) startTLS(r *bufio.Reader, cfg *tls.Config) (*bufio.Reader, error) {
	if err := c.sendOpt(optStartTLS, nil); err != nil {
		return nil, err
	}
	typ, data, err := c.readOptReply(r, optStartTLS)
	if err != nil {
		return nil, err
	}
	if typ != repAck {
		return nil, fmt.Errorf("nbd: the server refused TLS (%s): not continuing in plaintext", optErrName(typ, data))
	}
	if r.Buffered() > 0 {
		// The server speaks TLS only after our ClientHello: bytes before
		// it were not sent by a TLS peer.
		return nil, fmt.Errorf("%w: data after the STARTTLS reply", ErrProtocol)
	}
	tc := tls.Client(c.nc, cfg)
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("nbd: TLS handshake: %w", err)
	}
	c.nc = newTLSConn(tc, c.nc)
	return bufio.NewReaderSize(tc, 64<<10), nil
}

// setMetaContext asks for base:allocation; a server that refuses leaves
// Extents reporting everything as data.
func (c *Client) setMetaContext(r *bufio.Reader, export string) error {
	req := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	req = append(req, export...)
	req = binary.BigEndian.AppendUint32(req, 1)
	req = binary.BigEndian.AppendUint32(req, uint32(len(MetaContextBaseAllocation)))
	req = append(req, MetaContextBaseAllocation...)
	if err := c.sendOpt(optSetMetaContext, req); err != nil {
		return err
	}
	for {
		typ, data, err := c.readOptReply(r, optSetMetaContext)
		if err != nil {
			return err
		}
		switch {
		case typ == repMetaContext:
			if len(data) >= 4 && string(data[4:]) == MetaContextBaseAllocation {
				c.meta, c.metaID = true, binary.BigEndian.Uint32(data)
			}
		case typ == repAck || typ&repErrBit != 0:
			return nil
		default:
			return fmt.Errorf("%w: unexpected option reply %#x", ErrProtocol, typ)
		}
	}
}

func (c *Client) fixBlockSizes() {
	if c.minBlock == 0 || c.minBlock&(c.minBlock-1) != 0 {
		c.minBlock = 1
	}
	if c.prefBlock == 0 {
		c.prefBlock = max(4096, c.minBlock)
	}
	if c.maxBlock == 0 || c.maxBlock > DefaultMaxBlock {
		c.maxBlock = DefaultMaxBlock
	}
	if c.maxBlock < c.minBlock {
		c.maxBlock = c.minBlock
	}
	c.maxBlock -= c.maxBlock % c.minBlock
}

func (c *Client) exportName(r *bufio.Reader, export string, noZeroes bool) error {
	hdr := make([]byte, 16, 16+len(export))
	binary.BigEndian.PutUint64(hdr, optMagic)
	binary.BigEndian.PutUint32(hdr[8:], optExportName)
	binary.BigEndian.PutUint32(hdr[12:], uint32(len(export)))
	if _, err := c.nc.Write(append(hdr, export...)); err != nil {
		return fmt.Errorf("nbd: handshake: %w", err)
	}
	n := 10
	if !noZeroes {
		n += 124
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("nbd: handshake: export refused: %w", err)
	}
	size := binary.BigEndian.Uint64(b)
	if size > math.MaxInt64 {
		return fmt.Errorf("%w: export size %d too large", ErrProtocol, size)
	}
	c.size = int64(size)
	c.flags = binary.BigEndian.Uint16(b[8:])
	c.fixBlockSizes()
	return nil
}

func optErrName(typ uint32, data []byte) string {
	names := map[uint32]string{repErrUnsup: "unsupported", repErrPolicy: "policy", repErrInvalid: "invalid",
		repErrPlatform: "platform", repErrTLSReqd: "TLS required", repErrUnknown: "unknown export",
		repErrShutdown: "shutting down", repErrBlockSizeReq: "block size required", repErrTooBig: "too big"}
	s, ok := names[typ]
	if !ok {
		s = fmt.Sprintf("error %#x", typ)
	}
	if len(data) > 0 && len(data) < 1024 {
		s += ": " + string(data)
	}
	return s
}

func (c *Client) sendOpt(opt uint32, data []byte) error {
	b := make([]byte, 16, 16+len(data))
	binary.BigEndian.PutUint64(b, optMagic)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], uint32(len(data)))
	if _, err := c.nc.Write(append(b, data...)); err != nil {
		return fmt.Errorf("nbd: handshake: %w", err)
	}
	return nil
}

func (c *Client) readOptReply(r *bufio.Reader, opt uint32) (uint32, []byte, error) {
	var h [20]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, fmt.Errorf("nbd: handshake: %w", err)
	}
	if binary.BigEndian.Uint64(h[0:]) != optReplyMagic || binary.BigEndian.Uint32(h[8:]) != opt {
		return 0, nil, fmt.Errorf("%w: bad option reply", ErrProtocol)
	}
	n := binary.BigEndian.Uint32(h[16:])
	if n > maxOptionLen {
		return 0, nil, fmt.Errorf("%w: option reply too long", ErrProtocol)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return 0, nil, fmt.Errorf("nbd: handshake: %w", err)
	}
	return binary.BigEndian.Uint32(h[12:]), data, nil
}

// Size returns the export size in bytes.
func (c *Client) Size() int64 { return c.size }

// Flags returns the transmission flags the server sent.
func (c *Client) Flags() uint16 { return c.flags }

// BlockSizes returns the minimum, preferred and maximum block sizes.
func (c *Client) BlockSizes() (minimum, preferred, maximum uint32) {
	return c.minBlock, c.prefBlock, c.maxBlock
}

// fail makes err the terminal error and closes the connection. Whoever
// owns the reader then fails the pending calls; if nobody does, fail does.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.closing = true
	idle := !c.reading
	c.mu.Unlock()
	c.nc.Close()
	if idle {
		c.failPending(err)
	}
}

// end ends the connection at once because of why (a revocation list
// naming the server's certificate: WithTrack): pending and later
// requests fail with ErrClosed, wrapping why.
func (c *Client) end(why error) { c.fail(fmt.Errorf("%w: %w", ErrClosed, why)) }

// failPending marks the connection dead and fails every pending call with
// the connection's error (err if none was set).
func (c *Client) failPending(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	failErr := c.err
	pend := c.pending
	c.pending = nil
	clientCalls.Add(-int32(len(pend)))
	if len(pend) > 1 {
		deepClients.Add(-1)
	}
	c.reading = false
	c.closing = true
	untrack := c.untrack
	c.mu.Unlock()
	c.nc.Close()
	c.deadOnce.Do(func() {
		close(c.dead)
		if untrack != nil {
			untrack()
		}
	})
	for _, cl := range pend {
		cl.err = failErr
		close(cl.done)
		if cl.onDone != nil {
			cl.onDone(failErr)
		}
	}
}

// background reads replies whenever a caller hands it the reader: when
// requests are pending that no caller waits for by reading (several in
// flight, or callers that may give up), until none is pending.
func (c *Client) background() {
	defer close(c.readerDone)
	transmitting.Add(1)
	defer transmitting.Add(-1)
	dialled.Add(1)
	defer dialled.Add(-1)
	for {
		select {
		case <-c.wake:
		case <-c.dead:
			return
		}
		if err := c.readReplies(nil); err != nil {
			c.failPending(err)
			return
		}
	}
}

// readReplies reads replies while the caller owns the reader: until mine
// is done (a caller reading for itself), or until nothing is pending (the
// background reader, mine == nil). A caller whose reply has come hands the
// reader to the background reader if other requests are pending.
func (c *Client) readReplies(mine *call) error {
	for {
		c.mu.Lock()
		switch {
		case c.pending == nil: // failed meanwhile
			c.mu.Unlock()
			return nil
		case c.closing:
			// Closed (Close, a timeout) while we owned the reader: that
			// left the pending calls to us.
			err := c.err
			c.mu.Unlock()
			return err
		case mine != nil && mine.completed:
			if len(c.pending) == 0 {
				c.reading = false
			} else {
				select {
				case c.wake <- struct{}{}:
				default:
				}
			}
			c.mu.Unlock()
			return nil
		case mine == nil && len(c.pending) == 0:
			c.reading = false
			c.mu.Unlock()
			return nil
		}
		alone := mine != nil && len(c.pending) == 1
		c.mu.Unlock()
		c.rsMu.RLock()
		if alone && c.rs != nil && c.br.Buffered() == 0 {
			// Queue depth 1: wait for the reply outside the netpoller.
			c.awaitRaw(mine.typ == CmdFlush)
		}
		err := c.receiveOne(c.br)
		c.rsMu.RUnlock()
		if err != nil {
			return err
		}
	}
}

func (c *Client) lookup(h uint64) *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending[h]
}

// complete ends call cl (handle h), whose reply has been read. A call
// forgotten meanwhile (forget: its request could not be sent whole, and
// its caller heard of that instead) is not counted again, and its onDone
// is not called: the caller has it already.
func (c *Client) complete(h uint64, cl *call) {
	c.mu.Lock()
	_, pending := c.pending[h]
	if pending {
		delete(c.pending, h)
		clientCalls.Add(-1)
		if len(c.pending) == 1 {
			deepClients.Add(-1)
		}
	}
	cl.completed = true
	c.mu.Unlock()
	close(cl.done)
	if pending && cl.onDone != nil {
		cl.onDone(cl.err)
	}
}

// receiveInto reads n bytes for cl at dst, unless cl was abandoned.
func (c *Client) receiveInto(r *bufio.Reader, cl *call, dst []byte) error {
	if cl.state.CompareAndSwap(callLive, callReceiving) {
		err := c.readPayload(r, dst)
		cl.state.Store(callLive)
		return err
	}
	_, err := r.Discard(len(dst))
	return err
}

// readPayload fills dst from r. A large payload that has not arrived yet
// is awaited with the socket's SO_RCVLOWAT raised (never above what the
// payload still owes), so that over a slow link the reader wakes up once
// per many segments instead of once per segment (as the server's splice
// path does; see maxRcvLowat).
func (c *Client) readPayload(r *bufio.Reader, dst []byte) error {
	if c.rawc == nil || len(dst)-r.Buffered() < spliceMin {
		_, err := io.ReadFull(r, dst)
		return err
	}
	lowat := 1
	set := func(n int) {
		if n != lowat {
			c.rawc.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
			})
			lowat = n
		}
	}
	defer set(1)
	for got := 0; got < len(dst); {
		if rem := len(dst) - got - r.Buffered(); rem >= spliceMin {
			set(min(rem, maxRcvLowat))
		} else {
			set(1)
		}
		n, err := r.Read(dst[got:])
		got += n
		if err != nil && got < len(dst) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// receiveOne reads one reply (a simple reply, or one chunk of a structured
// one) and completes its call when it is the last.
func (c *Client) receiveOne(r *bufio.Reader) error {
	h := &c.hdr // escaped to the heap per reply as a local
	{
		if _, err := io.ReadFull(r, h[:4]); err != nil {
			return err
		}
		switch binary.BigEndian.Uint32(h[:4]) {
		case simpleReplyMagic:
			if _, err := io.ReadFull(r, h[4:16]); err != nil {
				return err
			}
			errno := binary.BigEndian.Uint32(h[4:])
			handle := binary.BigEndian.Uint64(h[8:])
			cl := c.lookup(handle)
			if cl == nil {
				return fmt.Errorf("%w: reply for unknown handle", ErrProtocol)
			}
			if errno != 0 {
				cl.err = c.replyError(errno, "")
			} else if cl.typ == CmdRead {
				if err := c.receiveInto(r, cl, cl.buf); err != nil {
					return err
				}
				cl.got = len(cl.buf)
			}
			c.complete(handle, cl)

		case structuredReplyMagic:
			if _, err := io.ReadFull(r, h[4:20]); err != nil {
				return err
			}
			flags := binary.BigEndian.Uint16(h[4:])
			typ := binary.BigEndian.Uint16(h[6:])
			handle := binary.BigEndian.Uint64(h[8:])
			n := binary.BigEndian.Uint32(h[16:])
			cl := c.lookup(handle)
			if cl == nil {
				return fmt.Errorf("%w: chunk for unknown handle", ErrProtocol)
			}
			if err := c.chunk(r, cl, typ, n); err != nil {
				return err
			}
			if flags&replyFlagDone != 0 {
				if cl.err == nil && cl.typ == CmdRead && cl.got != len(cl.buf) {
					cl.err = fmt.Errorf("%w: read reply covered %d of %d bytes", ErrProtocol, cl.got, len(cl.buf))
				}
				c.complete(handle, cl)
			}
		default:
			return fmt.Errorf("%w: bad reply magic", ErrProtocol)
		}
	}
	return nil
}

func (c *Client) chunk(r *bufio.Reader, cl *call, typ uint16, n uint32) error {
	switch typ {
	case replyTypeNone:
		if n != 0 {
			return fmt.Errorf("%w: NBD_REPLY_TYPE_NONE with payload", ErrProtocol)
		}
		return nil
	case replyTypeOffsetData, replyTypeOffsetHole:
		var b [12]byte
		hl := 8
		if typ == replyTypeOffsetHole {
			hl = 12
		}
		if cl.typ != CmdRead || n < uint32(hl) || (typ == replyTypeOffsetHole && n != 12) {
			return fmt.Errorf("%w: bad read chunk", ErrProtocol)
		}
		if _, err := io.ReadFull(r, b[:hl]); err != nil {
			return err
		}
		off := binary.BigEndian.Uint64(b[:])
		ln := uint64(n) - 8
		if typ == replyTypeOffsetHole {
			ln = uint64(binary.BigEndian.Uint32(b[8:]))
		}
		if off < cl.off || off-cl.off > uint64(len(cl.buf)) || ln > uint64(len(cl.buf))-(off-cl.off) {
			return fmt.Errorf("%w: read chunk outside the request", ErrProtocol)
		}
		dst := cl.buf[off-cl.off : off-cl.off+ln]
		if typ == replyTypeOffsetData {
			if err := c.receiveInto(r, cl, dst); err != nil {
				return err
			}
		} else if cl.state.CompareAndSwap(callLive, callReceiving) {
			clear(dst)
			cl.state.Store(callLive)
		}
		cl.got += int(ln)
		return nil
	case replyTypeBlockStatus:
		// Other servers may send more descriptors than ours does
		// (maxExtentsList); qemu sends up to 1 MiB of them.
		if cl.typ != CmdBlockStatus || n < 12 || (n-4)%8 != 0 || n > 4+1<<20 {
			return fmt.Errorf("%w: bad block status chunk", ErrProtocol)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		if binary.BigEndian.Uint32(b) != c.metaID {
			return nil // a context we did not ask for
		}
		for i := 4; i < len(b); i += 8 {
			cl.ext = append(cl.ext, Extent{Length: int64(binary.BigEndian.Uint32(b[i:])), Flags: binary.BigEndian.Uint32(b[i+4:])})
		}
		return nil
	default:
		if typ&(1<<15) == 0 {
			// Unknown non-error chunk.
			_, err := r.Discard(int(n))
			return err
		}
		if n < 6 || n > maxOptionLen {
			return fmt.Errorf("%w: bad error chunk", ErrProtocol)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		ml := int(binary.BigEndian.Uint16(b[4:]))
		msg := ""
		if 6+ml <= len(b) {
			msg = string(b[6 : 6+ml])
		}
		if cl.err == nil {
			cl.err = c.replyError(binary.BigEndian.Uint32(b), msg)
		}
		return nil
	}
}

// do sends one request and waits for its reply.
func (c *Client) do(ctx context.Context, typ, flags uint16, off uint64, length uint32, payload, dst []byte) error {
	_, err := c.doCall(ctx, typ, flags, off, length, payload, dst)
	return err
}

// doCall is do returning the completed call.
func (c *Client) doCall(ctx context.Context, typ, flags uint16, off uint64, length uint32, payload, dst []byte) (*call, error) {
	cl, err := c.start(typ, flags, off, length, payload, dst)
	if err != nil {
		return nil, err
	}
	return c.await(ctx, cl)
}

// start registers and sends one request; await waits for its reply.
func (c *Client) start(typ, flags uint16, off uint64, length uint32, payload, dst []byte) (*call, error) {
	return c.startDone(typ, flags, off, length, payload, dst, nil)
}

// startDone is start with the call's onDone. If the request was registered
// but could not be sent, onDone has been called (with the connection's
// error) when it returns, and it returns the completed call and a nil
// error when onDone is set.
func (c *Client) startDone(typ, flags uint16, off uint64, length uint32, payload, dst []byte, onDone func(error)) (*call, error) {
	cl := &call{typ: typ, off: off, buf: dst, done: make(chan struct{}), onDone: onDone}
	if c.timeout > 0 {
		cl.deadline = monoNow() + int64(c.timeout)
	}
	c.mu.Lock()
	if c.err != nil || c.pending == nil {
		err := c.err
		c.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return nil, err
	}
	c.handle++
	h := c.handle
	c.pending[h] = cl
	clientCalls.Add(1)
	deep := len(c.pending) > 1
	if len(c.pending) == 2 {
		deepClients.Add(1)
	}
	c.mu.Unlock()

	if err := c.send(Request{Flags: flags, Type: typ, Handle: h, Offset: off, Length: length}, payload, deep); err != nil {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
		if onDone != nil && c.forget(h) {
			// Not sent: the caller hears it now, and done never.
			c.fail(err)
			return nil, err
		}
		c.fail(err)
		<-cl.done
		if onDone != nil {
			return cl, nil // failed meanwhile: done has been called
		}
		if cl.err == nil {
			// It reached the server whole and was answered before the
			// failure: await returns the completed call. (A nil call
			// and a nil error made doCall's await dereference nil: a
			// move's copy whose connection was cut crashed its agent.)
			return cl, nil
		}
		return nil, cl.err
	}
	return cl, nil
}

// forget removes the pending call h, unless it has been completed or
// failed already, or its reply is being read into its buffer (then it
// reports false, and the call ends the usual way). A request whose send
// failed may have reached the server whole all the same (a writev that
// carried it and failed on the next): its reply may come, and the reader
// may have looked the call up already. Once forgotten, the call is
// abandoned, so that the reader discards such a reply's payload rather
// than write into a buffer the caller has taken back, and complete does
// not call its onDone.
func (c *Client) forget(h uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.pending[h]
	if !ok || !cl.state.CompareAndSwap(callLive, callAbandoned) {
		return false
	}
	delete(c.pending, h)
	clientCalls.Add(-1)
	if len(c.pending) == 1 {
		deepClients.Add(-1)
	}
	return true
}

// await waits for the reply of cl, a request start sent.
func (c *Client) await(ctx context.Context, cl *call) (*call, error) {
	// Someone must read the reply. If nobody is reading, a caller that
	// cannot give up early (no cancellable context) reads for itself:
	// at queue depth 1 its reply then reaches it without a hand-off
	// between goroutines. Otherwise the background reader reads. Once
	// the socket is closed nobody may start reading: whoever closed it
	// fails the pending calls (fail, Close). The watchdog fails the
	// connection when a reply is late, which makes a blocked read return.
	// (Between start and await nobody need read: the reply waits in the
	// socket, or another caller reading for itself reads it and hands
	// the reader on, see readReplies.)
	c.mu.Lock()
	lead := false
	if !cl.completed && !c.reading && c.pending != nil && !c.closing {
		c.reading = true
		if ctx.Done() == nil {
			lead = true
		} else {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	c.mu.Unlock()
	if lead {
		if err := c.readReplies(cl); err != nil {
			c.failPending(err)
		}
		<-cl.done
		return cl, cl.err
	}

	select {
	case <-cl.done:
		return cl, cl.err
	case <-ctx.Done():
		if cl.state.CompareAndSwap(callLive, callAbandoned) {
			return nil, ctx.Err()
		}
		c.fail(ctx.Err())
	}
	<-cl.done
	if cl.err != nil {
		return nil, cl.err
	}
	return nil, ctx.Err()
}

// A Started is a request sent and not yet awaited (StartFlush). Wait must
// be called once.
type Started struct {
	c   *Client
	cl  *call
	err error
}

// StartFlush sends NBD_CMD_FLUSH and returns without waiting for the
// reply, which Wait awaits: a caller flushing several connections (a
// composed volume's parts) sends every flush first and then awaits them in
// turn, on its own goroutine, instead of a goroutine per connection, each
// woken by the netpoller.
func (c *Client) StartFlush() *Started {
	if c.flags&FlagSendFlush == 0 {
		return &Started{}
	}
	cl, err := c.start(CmdFlush, 0, 0, 0, nil, nil)
	return &Started{c: c, cl: cl, err: err}
}

// ErrTooLarge is returned by StartWrite for a write larger than the
// server's maximum block size (WriteAt splits those).
var ErrTooLarge = errors.New("nbd: write larger than the server's maximum block size")

// StartWrite sends NBD_CMD_WRITE of p at off without waiting for the reply:
// it returns once the request is queued for the socket (written by this
// caller, or by the one writing now, before anything queued later; if this
// caller's write fails, StartWrite returns ErrClosed), and
// done is called once with the outcome (the server's reply, or the
// connection's failure, e.g. ErrTimeout from the request timeout) by
// whoever reads it (the background reader, or a caller reading its own
// reply); done must not block. p must stay untouched until then. If the
// request cannot be sent at all (a closed connection, a bad range,
// ErrTooLarge) StartWrite returns the error and never calls done.
func (c *Client) StartWrite(p []byte, off int64, done func(error)) error {
	return c.startAsync(CmdWrite, p, off, done)
}

// readerFor makes sure someone reads the reply of cl, a call nobody awaits
// (StartWrite, StartRead): it wakes the background reader unless somebody
// reads already (as await does for a caller that can give up).
func (c *Client) readerFor(cl *call) {
	c.mu.Lock()
	if !cl.completed && !c.reading && c.pending != nil && !c.closing {
		c.reading = true
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	c.mu.Unlock()
}

// StartRead sends NBD_CMD_READ of len(p) bytes at off without waiting for
// the reply, as StartWrite does for a write: done is called once with the
// outcome, by whoever reads the reply, once p holds the bytes (or the read
// failed); done must not block, and p must stay untouched until then. If
// the request cannot be sent at all (a closed connection, a bad range,
// ErrTooLarge) StartRead returns the error and never calls done.
func (c *Client) StartRead(p []byte, off int64, done func(error)) error {
	return c.startAsync(CmdRead, p, off, done)
}

// startAsync sends a read into p or a write of p at off whose outcome goes
// to done (StartRead, StartWrite).
func (c *Client) startAsync(typ uint16, p []byte, off int64, done func(error)) error {
	what, payload, dst := "write", p, []byte(nil)
	if typ == CmdRead {
		what, payload, dst = "read", nil, p
	}
	if off < 0 || off+int64(len(p)) > c.size {
		return fmt.Errorf("nbd: %s [%d,+%d) beyond export size %d", what, off, len(p), c.size)
	}
	if len(p) == 0 || len(p) > int(c.maxBlock) {
		return ErrTooLarge
	}
	cl, err := c.startDone(typ, 0, uint64(off), uint32(len(p)), payload, dst, done)
	if err != nil {
		return err
	}
	c.readerFor(cl)
	return nil
}

// Wait waits for the reply of the request and returns its error. Like a
// call with a context that cannot be cancelled, it reads the reply itself
// when nobody else is reading.
func (s *Started) Wait() error {
	if s.err != nil || s.cl == nil {
		return s.err
	}
	_, err := s.c.await(context.Background(), s.cl)
	return err
}

// send queues request r (with payload, which must stay untouched until the
// request's reply or the connection's failure) and, unless another caller
// is writing already (it then writes this request too), writes the queue
// until it is empty; deep says that other requests are in flight on the
// connection (then the writer yields once before its first write). Requests that callers queue while a write is under
// way leave together in the next writev: at depth, one system call
// carries several requests. An error means the connection is broken; the
// caller fails it, which fails every request queued with this one.
func (c *Client) send(r Request, payload []byte, deep bool) error {
	c.wmu.Lock()
	if c.werr != nil {
		// A failed write may have left part of a request on the wire:
		// another byte would be read as the rest of it.
		err := c.werr
		c.wmu.Unlock()
		return err
	}
	q := &c.wq
	n := len(q.hdrs)
	q.hdrs = append(q.hdrs, make([]byte, requestHeaderLen)...)
	putRequest(q.hdrs[n:], r)
	if len(payload) == 0 {
		payload = nil
	}
	q.payloads = append(q.payloads, payload)
	if c.flushing {
		c.wmu.Unlock()
		return nil
	}
	c.flushing = true
	if deep {
		// Other requests are in flight on this connection, so their
		// callers (the local export's workers, say) are likely about to
		// send more: let the goroutines ready to run do so first, and
		// write what they queued with this request, in one system call
		// instead of one each. At depth 1 nobody waits here.
		c.wmu.Unlock()
		runtime.Gosched()
		c.wmu.Lock()
	}
	for len(c.wq.payloads) > 0 {
		c.wq, c.wspare = c.wspare, c.wq
		q := &c.wspare
		c.wmu.Unlock()
		q.out = q.buffers()
		c.rsMu.RLock()
		c.wsince.Store(monoNow())
		_, err := writeBuffers(c.nc, &q.out)
		c.wsince.Store(0)
		c.rsMu.RUnlock()
		c.wmu.Lock()
		q.reset()
		if err != nil {
			// Nothing queued can be written after a failed write: the
			// caller fails the connection, and with it those requests.
			c.wq.reset()
			c.flushing = false
			c.werr = err
			c.wmu.Unlock()
			return err
		}
	}
	c.flushing = false
	c.wmu.Unlock()
	return nil
}

// ReadAtContext reads len(p) bytes at off, splitting into requests no larger
// than the server's maximum block size and issuing them concurrently.
func (c *Client) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("nbd: negative offset")
	}
	var eof error
	if off >= c.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	if rem := c.size - off; int64(len(p)) > rem {
		p = p[:rem]
		eof = io.EOF
	}
	var err error
	if len(p) <= int(c.maxBlock) {
		err = c.do(ctx, CmdRead, 0, uint64(off), uint32(len(p)), nil, p)
	} else {
		err = c.chunked(ctx, p, off, func(b []byte, o int64) error {
			return c.do(ctx, CmdRead, 0, uint64(o), uint32(len(b)), nil, b)
		})
	}
	if err != nil {
		return 0, err
	}
	return len(p), eof
}

// WriteAtContext writes p at off; fua asks for it to be durable on return.
func (c *Client) WriteAtContext(ctx context.Context, p []byte, off int64, fua bool) (int, error) {
	if off < 0 || off+int64(len(p)) > c.size {
		return 0, fmt.Errorf("nbd: write [%d,+%d) beyond export size %d", off, len(p), c.size)
	}
	var fl uint16
	if fua && c.flags&FlagSendFUA != 0 {
		fl = CmdFlagFUA
	}
	var err error
	if len(p) <= int(c.maxBlock) {
		err = c.do(ctx, CmdWrite, fl, uint64(off), uint32(len(p)), p, nil)
	} else {
		err = c.chunked(ctx, p, off, func(b []byte, o int64) error {
			return c.do(ctx, CmdWrite, fl, uint64(o), uint32(len(b)), b, nil)
		})
	}
	if err != nil {
		return 0, err
	}
	if fua && fl == 0 {
		if err := c.FlushContext(ctx); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// chunked runs f over pieces of p no larger than the maximum block size,
// concurrently when there are several.
func (c *Client) chunked(ctx context.Context, p []byte, off int64, f func([]byte, int64) error) error {
	mx := int(c.maxBlock)
	if len(p) <= mx {
		return f(p, off)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for i := 0; i < len(p); i += mx {
		j := min(i+mx, len(p))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(p[i:j], off+int64(i)); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// CanExtents reports whether the server agreed to base:allocation, so that
// Extents asks it rather than reporting everything as data.
func (c *Client) CanExtents() bool { return c.meta }

// ExtentsContext asks the server which parts of [off, off+n) are holes or
// read as zeroes (NBD_CMD_BLOCK_STATUS, base:allocation). The answer may
// cover fewer than n bytes but covers at least one. Without base:allocation
// it reports the whole range as data.
func (c *Client) ExtentsContext(ctx context.Context, off, n int64) ([]Extent, error) {
	if off < 0 || n <= 0 || off > c.size || n > c.size-off {
		return nil, fmt.Errorf("nbd: extents [%d,+%d) outside the %d-byte export", off, n, c.size)
	}
	// One request covers at most 4 GiB minus a block.
	n = min(n, int64(math.MaxUint32)/int64(c.minBlock)*int64(c.minBlock))
	if !c.meta {
		return []Extent{{Length: n}}, nil
	}
	cl, err := c.doCall(ctx, CmdBlockStatus, 0, uint64(off), uint32(n), nil, nil)
	if err != nil {
		return nil, err
	}
	var out []Extent
	covered := int64(0)
	for _, x := range cl.ext {
		if x.Length <= 0 || covered >= n {
			break
		}
		x.Length = min(x.Length, n-covered)
		out = append(out, x)
		covered += x.Length
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: empty block status reply", ErrProtocol)
	}
	return out, nil
}

// Extents is ExtentsContext without a context; it makes a Client an
// Extenter.
func (c *Client) Extents(off, n int64) ([]Extent, error) {
	return c.ExtentsContext(context.Background(), off, n)
}

// ReadAt implements io.ReaderAt with the default request timeout.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	return c.ReadAtContext(context.Background(), p, off)
}

// WriteAt implements io.WriterAt.
func (c *Client) WriteAt(p []byte, off int64) (int, error) {
	return c.WriteAtContext(context.Background(), p, off, false)
}

// FlushContext asks the server to make all completed writes durable.
func (c *Client) FlushContext(ctx context.Context) error {
	if c.flags&FlagSendFlush == 0 {
		return nil
	}
	return c.do(ctx, CmdFlush, 0, 0, 0, nil, nil)
}

// Flush implements Backend.
func (c *Client) Flush() error { return c.FlushContext(context.Background()) }

// effect issues a payload-free command over [off, off+n) in pieces.
func (c *Client) effect(ctx context.Context, typ, flags uint16, off, n int64) error {
	if off < 0 || n < 0 || off+n > c.size {
		return fmt.Errorf("nbd: range [%d,+%d) beyond export size %d", off, n, c.size)
	}
	const piece = 1 << 30
	for n > 0 {
		k := min(n, piece)
		if err := c.do(ctx, typ, flags, uint64(off), uint32(k), nil, nil); err != nil {
			return err
		}
		off += k
		n -= k
	}
	return nil
}

// TrimContext discards a range; ErrUnsupported if the export cannot trim.
func (c *Client) TrimContext(ctx context.Context, off, n int64) error {
	if c.flags&FlagSendTrim == 0 {
		return ErrUnsupported
	}
	return c.effect(ctx, CmdTrim, 0, off, n)
}

// Trim implements Trimmer.
func (c *Client) Trim(off, n int64) error { return c.TrimContext(context.Background(), off, n) }

// WriteZeroesContext zeroes a range (writing zero buffers if the server lacks
// NBD_CMD_WRITE_ZEROES).
func (c *Client) WriteZeroesContext(ctx context.Context, off, n int64, noHole bool) error {
	if c.flags&FlagSendWriteZeroes == 0 {
		for n > 0 {
			k := min(n, int64(len(zeroes)))
			if _, err := c.WriteAtContext(ctx, zeroes[:k], off, false); err != nil {
				return err
			}
			off += k
			n -= k
		}
		return nil
	}
	var fl uint16
	if noHole {
		fl = CmdFlagNoHole
	}
	return c.effect(ctx, CmdWriteZeroes, fl, off, n)
}

// WriteZeroes implements Zeroer.
func (c *Client) WriteZeroes(off, n int64, noHole bool) error {
	return c.WriteZeroesContext(context.Background(), off, n, noHole)
}

// Close sends NBD_CMD_DISC, closes the connection and fails pending requests
// with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	alive := c.err == nil || c.shut
	if c.err == nil {
		c.err = ErrClosed
	}
	c.shut = false
	c.mu.Unlock()
	if alive && c.wmu.TryLock() {
		// Unless a request is being written or a write failed (then
		// the server sees the connection close instead).
		if !c.flushing && c.werr == nil {
			var hdr [requestHeaderLen]byte
			putRequest(hdr[:], Request{Type: CmdDisc})
			if c.rs != nil {
				c.discRaw(hdr[:])
			} else {
				c.nc.SetWriteDeadline(time.Now().Add(time.Second))
				c.nc.Write(hdr[:])
			}
		}
		c.wmu.Unlock()
	}
	var err error
	if t, ok := c.nc.(*tlsConn); ok && alive {
		t.closeNotify(time.Second)
	} else {
		err = c.nc.Close()
	}
	c.mu.Lock()
	c.closing = true
	idle := !c.reading
	c.mu.Unlock()
	if idle {
		// Nobody reads, so nobody else notices: fail what is pending
		// and stop the background reader. (A reader gets an error from
		// the closed socket, or notices closing, and does it.)
		c.failPending(ErrClosed)
	}
	<-c.readerDone
	<-c.wdDone
	c.releaseRaw()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// replyError is the error of a request the server answered with errno
// (and msg). ESHUTDOWN (the server is stopping the connection) fails
// every later request too, with ErrShutdown.
func (c *Client) replyError(errno uint32, msg string) error {
	e := &Error{Errno: errno, Message: msg}
	if errno != ESHUTDOWN {
		return e
	}
	c.mu.Lock()
	if c.err == nil {
		c.err, c.shut = ErrShutdown, true
	}
	c.mu.Unlock()
	return fmt.Errorf("%w: %w", ErrShutdown, e)
}
