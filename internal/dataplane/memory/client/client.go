package client

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/internal/rawconn"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/pki"
)

// Channel selects how a request travels.
type Channel int

// Channels.
const (
	ChannelAdaptive Channel = iota // chosen per request (see Client.choose)
	ChannelSync                    // fine-grained synchronous, one connection
	ChannelBulk                    // chunks over parallel streams
	ChannelQueue                   // pipelined on the client's queue pair
)

func (ch Channel) String() string {
	switch ch {
	case ChannelAdaptive:
		return "adaptive"
	case ChannelSync:
		return "sync"
	case ChannelBulk:
		return "bulk"
	case ChannelQueue:
		return "queue"
	}
	return fmt.Sprintf("channel(%d)", int(ch))
}

// Options tune a Client. The zero value is valid.
type Options struct {
	// Timeout bounds every request (and the handshake): a donor that does not
	// answer in time makes the request fail with protocol.ErrDonorLost. Default 5 s.
	Timeout time.Duration
	// Streams is the number of parallel bulk connections. Default 2.
	Streams int
	// ChunkSize is the bulk chunk size. Default 512 KiB, at most protocol.MaxPayload.
	ChunkSize int
	// QueueChunk is the largest request the queue channel sends in one frame.
	// Default 64 KiB.
	QueueChunk int
	// BulkThreshold: adaptive requests at least this large always use the
	// bulk channel. Default 2 MiB: above it the parallel bulk streams beat
	// one synchronous round trip per MaxPayload on an idle machine.
	BulkThreshold int
	// Spin is how long the synchronous channel and the mapping's fault
	// handler busy-poll for a reply before sleeping. Zero disables it.
	Spin time.Duration
	// Dialer dials the donor; nil uses a net.Dialer. With TLS it must
	// return TCP connections.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
	// TLS, if set, runs every connection inside a TLS session with this
	// client configuration (a donor that requires TLS: a rialto-mems://
	// URI; normally pki.LoadClientTLS of the cluster CA's certificate). An
	// empty ServerName is the host of the donor's address. Nil speaks
	// plaintext, which such a donor refuses (ErrTLSRequired).
	TLS *tls.Config
	// Track, if set, is handed each TLS connection of the session once
	// its handshake is done (pki.TrackFunc): normally the Tracker of the
	// revocation list TLS checks donors with (pki.Roots.Tracker). When a
	// list it takes later revokes the certificate the donor presented,
	// the session is lost (its requests fail with an error wrapping
	// protocol.ErrDonorLost and pki.ErrRevoked) and its connections to
	// that donor are ended at once; a Following then opens no session
	// there again (see Following). A connection Track refuses (a list
	// taken since its handshake revokes the donor) fails as a failed
	// handshake does. Connections handed to another process (Handoff)
	// are not tracked: the donor ends them with the session.
	Track pki.TrackFunc
	// MoveGeneration, for a move's source only: the generation of the
	// region it sends (donor.RegionGeneration), carried in the session's
	// control HELLO (protocol.MoveGeneration) so that the destination's
	// region, once served as the lease's, keeps it. 0 carries none.
	MoveGeneration uint64
}

func (o *Options) fill() {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Streams <= 0 {
		o.Streams = 2
	}
	if o.ChunkSize <= 0 || o.ChunkSize > protocol.MaxPayload {
		o.ChunkSize = 512 << 10
	}
	if o.QueueChunk <= 0 || o.QueueChunk > protocol.MaxPayload {
		o.QueueChunk = 64 << 10
	}
	if o.BulkThreshold <= 0 {
		o.BulkThreshold = 2 << 20
	}
	o.Spin = max(o.Spin, 0)
	if o.TLS != nil {
		o.TLS = o.TLS.Clone()
		// Bulk transfers want full records from the first byte.
		o.TLS.DynamicRecordSizingDisabled = true
	}
	if o.Dialer == nil {
		var d net.Dialer
		o.Dialer = func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}
	}
}

// Client is a borrower's session with one donor region.
type Client struct {
	addr, cred string
	opts       Options
	size       int64
	session    uint64
	gen        uint64 // the region's generation (protocol.HelloReply); 0 from an older donor

	ctrl     net.Conn
	ctrlDone chan struct{}

	sync    syncConn
	streams []*bulkStream
	// qp is the client's own queue pair (the queue channel's); one that
	// broke is re-established by its next request (QueuePair.revive).
	qp *QueuePair

	qmu    sync.Mutex
	queues map[uint32]*QueuePair

	syncBusy    atomic.Int32 // callers inside the sync channel
	inflight    atomic.Int32 // adaptive requests in progress
	lastOverlap atomic.Int64 // monoNow when adaptive requests last overlapped; 0: not within concurrencyMemory
	closed      atomic.Bool
	errOnce     sync.Once
	lostErr     atomic.Pointer[error]
	rejoins     atomic.Int64 // data connections re-established (rejoin.go)
}

// Dial opens a session on the region identified by credential at addr: a
// control connection (which carries credit updates), the synchronous
// connection, the client's queue pair and the bulk streams.
func Dial(ctx context.Context, addr, credential string, opts Options) (*Client, error) {
	opts.fill()
	c := &Client{addr: addr, cred: credential, opts: opts, queues: map[uint32]*QueuePair{}, ctrlDone: make(chan struct{})}
	ctrl, rep, err := c.handshake(ctx, protocol.KindControl, 0)
	if err != nil {
		return nil, err
	}
	c.ctrl = ctrl
	c.size = int64(rep.Offset)
	c.session = rep.session
	c.gen = rep.gen
	go c.readControl()
	ok := false
	defer func() {
		if !ok {
			_ = c.Close()
		}
	}()
	c.sync.kind = protocol.KindSync
	pg, id, err := c.newRaw(ctx, protocol.KindSync, 0)
	if err != nil {
		return nil, err
	}
	c.sync.pg.Store(pg)
	c.sync.id = id
	for range opts.Streams {
		pg, id, err := c.newRaw(ctx, protocol.KindBulk, 0)
		if err != nil {
			return nil, err
		}
		s := &bulkStream{}
		s.kind, s.id = protocol.KindBulk, id
		s.pg.Store(pg)
		c.streams = append(c.streams, s)
	}
	qp, err := c.NewQueuePair(ctx)
	if err != nil {
		return nil, err
	}
	c.qp = qp
	ok = true
	return c, nil
}

// newRaw opens a connection of the session driven with raw syscalls (see
// rawconn), which replaces the connection whose id is replaces (0: none;
// see protocol.ReplacedConnection), and returns it with its id. Over TLS
// the descriptor is detached before the handshake, so that the session's
// records travel on the raw syscalls too.
func (c *Client) newRaw(ctx context.Context, kind uint8, replaces uint32) (*rawconn.Conn, uint32, error) {
	if c.opts.TLS == nil {
		conn, rep, err := c.handshake(ctx, kind, replaces)
		if err != nil {
			return nil, 0, err
		}
		fd, err := rawconn.Detach(conn)
		_ = conn.Close()
		if err != nil {
			return nil, 0, err
		}
		return rawconn.New(fd, c.opts.Spin, c.opts.Timeout), rep.queue, nil
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, 0, err
	}
	fd, err := rawconn.Detach(conn)
	_ = conn.Close()
	if err != nil {
		return nil, 0, err
	}
	p := rawconn.New(fd, c.opts.Spin, c.opts.Timeout)
	if err := p.StartTLS(c.tlsConfig(), false); err != nil {
		p.Close()
		return nil, 0, tlsDialErr(c.addr, err)
	}
	if c.opts.Track != nil {
		untrack, err := c.opts.Track(c.addr, p.ConnectionState(), func(why error) {
			c.revoked(why)
			p.Shutdown()
		})
		if err != nil {
			p.Close()
			return nil, 0, tlsDialErr(c.addr, err)
		}
		p.OnClose(untrack)
	}
	rep, err := c.hello(p, kind, replaces)
	if err != nil {
		p.Close()
		return nil, 0, err
	}
	return p, rep.queue, nil
}

// tlsConfig is Options.TLS with the donor's host as ServerName when it
// names none.
func (c *Client) tlsConfig() *tls.Config {
	cfg := c.opts.TLS
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = c.addr
		if host, _, err := net.SplitHostPort(c.addr); err == nil {
			cfg.ServerName = host
		}
	}
	return cfg
}

// tlsDialErr is a failed TLS handshake with the donor: a lost donor, and
// a hint when it is most likely a plaintext one.
func tlsDialErr(addr string, err error) error {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		return fmt.Errorf("%w: TLS handshake with %s: the donor does not speak TLS (its URI is rialto-mem://, not rialto-mems://): %w", protocol.ErrDonorLost, addr, err)
	}
	return fmt.Errorf("%w: TLS handshake with %s: %w", protocol.ErrDonorLost, addr, err)
}

// TLS reports whether the session runs over TLS (Options.TLS).
func (c *Client) TLS() bool { return c.opts.TLS != nil }

// Join opens one more connection of the session, of the given kind (any
// but protocol.KindControl), and performs its HELLO; the caller owns the
// connection. A mapping's fault handler takes one of kind
// protocol.KindFault.
func (c *Client) Join(ctx context.Context, kind uint8) (net.Conn, error) {
	conn, _, err := c.JoinReplacing(ctx, kind, ConnRef{})
	return conn, err
}

// ConnRef names a data connection of a session: the session's id and
// the connection's id in it (its HELLO reply's, protocol.HelloReply). The
// zero ConnRef names none.
type ConnRef struct {
	Session uint64
	ID      uint32
}

// JoinReplacing is Join for a connection that replaces old, one its
// owner gave up (a mapping's fault connection whose write-back timed
// out): if old is a connection of this session, the HELLO names it
// (protocol.ReplacedConnection), and the donor ends it, a WRITE under
// way or held on it included, before it answers, so that nothing more
// of old lands after what the new connection carries. A connection of
// another session (one the session followed from) is not named: its id
// means nothing here. It returns the new connection's ConnRef (ID 0 from
// an older donor, which ignores the name).
func (c *Client) JoinReplacing(ctx context.Context, kind uint8, old ConnRef) (net.Conn, ConnRef, error) {
	if kind == protocol.KindControl {
		return nil, ConnRef{}, fmt.Errorf("memory: a session has one control connection")
	}
	if err := c.err(); err != nil {
		return nil, ConnRef{}, err
	}
	conn, rep, err := c.handshake(ctx, kind, c.replaces(old))
	if err != nil {
		return nil, ConnRef{}, err
	}
	return conn, ConnRef{Session: c.session, ID: rep.queue}, nil
}

// replaces is the id a HELLO of this session names for old (0: none,
// old being of another session).
func (c *Client) replaces(old ConnRef) uint32 {
	if old.Session != c.session {
		return 0
	}
	return old.ID
}

// Handoff lets another process open a connection of this session by
// itself: a mapping's fault handler, when the session runs over TLS (a TLS
// session's state cannot cross processes). The process runs TLS over the
// connection DialHandoff returns with TLSConfig, which accepts only the
// key this session verified against the CA, then Hello. It carries the
// lease credential: hand it over a private channel, never in arguments or
// the environment.
type Handoff struct {
	Hello      protocol.Hello
	ServerName string
	// PeerKey is the SHA-256 of the donor certificate's public key (its
	// SubjectPublicKeyInfo), as the session's control connection saw it.
	PeerKey [32]byte
	// Replaces is the id of the connection of the same session the new
	// one replaces (0: none), which its HELLO names (see JoinReplacing;
	// Following.RejoinHandoff sets it).
	Replaces uint32 `json:",omitempty"`
}

// DialHandoff dials a connection to the donor for a connection of kind
// that another process completes (see Handoff); nothing is sent on it.
// The session must run over TLS: a plaintext one hands out connections
// with Join.
func (c *Client) DialHandoff(ctx context.Context, kind uint8) (net.Conn, Handoff, error) {
	var h Handoff
	if kind == protocol.KindControl {
		return nil, h, fmt.Errorf("memory: a session has one control connection")
	}
	if err := c.err(); err != nil {
		return nil, h, err
	}
	tc, ok := c.ctrl.(*tls.Conn)
	if !ok {
		return nil, h, fmt.Errorf("memory: the session does not run over TLS: use Join")
	}
	st := tc.ConnectionState()
	if len(st.PeerCertificates) == 0 {
		return nil, h, fmt.Errorf("memory: the donor presented no certificate")
	}
	h = Handoff{Hello: protocol.Hello{Kind: kind, Session: c.session, Credential: c.cred},
		ServerName: c.tlsConfig().ServerName, PeerKey: sha256.Sum256(st.PeerCertificates[0].RawSubjectPublicKeyInfo)}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, Handoff{}, err
	}
	return conn, h, nil
}

// TLSConfig is the client configuration of a handed-off connection: the
// donor must present a certificate for the key the session verified.
func (h Handoff) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS12,
		ServerName:                  h.ServerName,
		DynamicRecordSizingDisabled: true,
		// The chain was verified by the session; the key is pinned here.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || sha256.Sum256(cs.PeerCertificates[0].RawSubjectPublicKeyInfo) != h.PeerKey {
				return errors.New("memory: the donor's key is not the one the session verified")
			}
			return nil
		},
	}
}

// Timeout is the client's request timeout (Options.Timeout, filled).
func (c *Client) Timeout() time.Duration { return c.opts.Timeout }

type helloReply struct {
	protocol.Header
	session uint64
	queue   uint32
	gen     uint64
}

// Generation is the region's generation as the donor reported it when
// the session opened (see protocol.HelloReply): a region created again
// under the same credential has another. Zero if the donor does not
// report it (an older donor).
func (c *Client) Generation() uint64 { return c.gen }

// dial connects to the donor (TCP, nothing sent yet).
func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	conn, err := c.opts.Dialer(ctx, c.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", protocol.ErrDonorLost, c.addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return conn, nil
}

// handshake dials one connection, runs TLS over it with Options.TLS, and
// performs HELLO (for a connection that replaces the one whose id is
// replaces: see hello).
func (c *Client) handshake(ctx context.Context, kind uint8, replaces uint32) (net.Conn, helloReply, error) {
	var rep helloReply
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, rep, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	if c.opts.TLS != nil {
		var tcp *trackedConn
		if c.opts.Track != nil {
			tcp = &trackedConn{Conn: conn}
			conn = tcp
		}
		tc := tls.Client(conn, c.tlsConfig())
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, rep, tlsDialErr(c.addr, err)
		}
		if tcp != nil {
			// Ended under the TLS session: nothing more is said to a
			// donor whose certificate is revoked.
			untrack, err := c.opts.Track(c.addr, tc.ConnectionState(), func(why error) {
				c.revoked(why)
				_ = tcp.Close()
			})
			if err != nil {
				_ = tcp.Close()
				return nil, rep, tlsDialErr(c.addr, err)
			}
			tcp.setUntrack(untrack)
		}
		conn = tc
	}
	if rep, err = c.hello(conn, kind, replaces); err != nil {
		_ = conn.Close()
		return nil, rep, err
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, rep, nil
}

// hello sends HELLO for a connection of kind and reads the donor's reply.
// A data connection that re-establishes one the client gave up names it
// (replaces, its id: protocol.ReplacedConnection): the donor ends that
// one, and answers once nothing more of it can land (rejoin.go).
func (c *Client) hello(rw io.ReadWriter, kind uint8, replaces uint32) (helloReply, error) {
	m := protocol.Hello{Kind: kind, Session: c.session, Credential: c.cred}
	offset := uint64(replaces)
	if kind == protocol.KindControl {
		m.Session, offset = 0, c.opts.MoveGeneration
	}
	return sendHello(rw, m, offset)
}

// Hello sends the HELLO m on rw (a connection to the donor, TLS already
// running if it must), naming the connection of the session it replaces
// (replaces, its id; 0: none; see JoinReplacing), reads the donor's reply
// and returns the new connection's id in the session; a refusal is
// returned as its status's error (protocol.ErrAuth, ErrBusy,
// ErrTLSRequired, …). A process that opens a connection of a session on
// its own (a mapping's fault handler, see Handoff) uses it.
func Hello(rw io.ReadWriter, m protocol.Hello, replaces uint32) (uint32, error) {
	if m.Kind == protocol.KindControl {
		replaces = 0
	}
	rep, err := sendHello(rw, m, uint64(replaces))
	return rep.queue, err
}

// sendHello sends the HELLO m, carrying offset (a control HELLO's
// protocol.MoveGeneration, a data connection's
// protocol.ReplacedConnection) in its offset, and reads the reply.
func sendHello(rw io.ReadWriter, m protocol.Hello, offset uint64) (helloReply, error) {
	var rep helloReply
	b := make([]byte, protocol.HeaderSize, protocol.HeaderSize+protocol.HelloFixed+len(m.Credential))
	b = m.Encode(b)
	// Length: the largest reply this client reads (one with the region's
	// generation); older donors ignore it, and the offset.
	h := protocol.Header{Op: protocol.OpHello, Payload: uint32(len(b) - protocol.HeaderSize), Length: protocol.HelloReplyGenSize,
		Offset: offset}
	h.Encode(b)
	if _, err := rw.Write(b); err != nil {
		return rep, fmt.Errorf("%w: hello: %v", protocol.ErrDonorLost, err)
	}
	var hdr [protocol.HeaderSize]byte
	f, err := protocol.ReadFrame(rw, hdr[:], nil)
	if err != nil {
		if errors.Is(err, protocol.ErrBadFrame) || errors.Is(err, protocol.ErrVersion) || errors.Is(err, protocol.ErrDonorLost) {
			return rep, err
		}
		return rep, fmt.Errorf("%w: hello: %v", protocol.ErrDonorLost, err)
	}
	if f.Status != protocol.StatusOK {
		return rep, protocol.StatusError(f.Status, f.Data)
	}
	if f.Op != protocol.OpHello {
		return rep, fmt.Errorf("%w: unexpected hello reply", protocol.ErrBadFrame)
	}
	hr, err := protocol.DecodeHelloReply(f.Data)
	if err != nil {
		return rep, err
	}
	rep.Header = f.Header
	rep.session, rep.queue, rep.gen = hr.Session, hr.Queue, hr.Generation
	return rep, nil
}

// readControl applies credit updates until the control connection ends.
func (c *Client) readControl() {
	defer close(c.ctrlDone)
	var hdr [protocol.HeaderSize]byte
	var buf []byte // the payloads of frames ignored, reused (at most protocol.MaxPayload)
	for {
		f, err := protocol.ReadFrame(c.ctrl, hdr[:], buf)
		if err != nil {
			c.lost(fmt.Errorf("%w: control connection: %v", protocol.ErrDonorLost, err))
			return
		}
		if cap(f.Data) > cap(buf) {
			buf = f.Data
		}
		// A credit update is an OK CREDIT response naming a queue id (32
		// bits); an error response carries no credits.
		if f.Op != protocol.OpCredit || f.Status != protocol.StatusOK || f.Offset > math.MaxUint32 {
			continue
		}
		c.qmu.Lock()
		q := c.queues[uint32(f.Offset)]
		c.qmu.Unlock()
		if q != nil {
			q.grant(uint32(f.Offset), f.Credits)
		}
	}
}

// lost records the first fatal session error and ends the queue pairs
// (QueuePair.lose: a pair reads the answers its connection holds for the
// requests pending before it fails them).
func (c *Client) lost(err error) {
	c.errOnce.Do(func() {
		if c.closed.Load() {
			err = protocol.ErrClosed
		}
		c.lostErr.Store(&err)
		c.qmu.Lock()
		qs := make([]*QueuePair, 0, len(c.queues))
		for _, q := range c.queues {
			qs = append(qs, q)
		}
		c.qmu.Unlock()
		for _, q := range qs {
			q.lose(err)
		}
	})
}

// revoked loses the session because a revocation list names the
// certificate its donor presented on one of its connections (why, from
// Options.Track; the caller ends that connection): no request goes out
// on the session any more.
func (c *Client) revoked(why error) {
	c.lost(fmt.Errorf("%w: the session with %s was ended: %w", protocol.ErrDonorLost, c.addr, why))
}

// trackedConn is the TCP connection under a TLS connection of the
// session that a revocation list tracks (Options.Track): closing it
// takes it off the list.
type trackedConn struct {
	net.Conn
	mu      sync.Mutex
	closed  bool
	untrack func()
}

func (t *trackedConn) Close() error {
	err := t.Conn.Close()
	t.mu.Lock()
	f := t.untrack
	t.untrack, t.closed = nil, true
	t.mu.Unlock()
	if f != nil {
		f()
	}
	return err
}

// setUntrack makes Close call f (at once if it was closed already).
func (t *trackedConn) setUntrack(f func()) {
	t.mu.Lock()
	if !t.closed {
		t.untrack = f
		f = nil
	}
	t.mu.Unlock()
	if f != nil {
		f()
	}
}

// CloseRead ends the TCP connection for reading (see closeRead).
func (t *trackedConn) CloseRead() error {
	if cr, ok := t.Conn.(interface{ CloseRead() error }); ok {
		return cr.CloseRead()
	}
	return errors.ErrUnsupported
}

func (c *Client) err() error {
	if p := c.lostErr.Load(); p != nil {
		return *p
	}
	if c.closed.Load() {
		return protocol.ErrClosed
	}
	return nil
}

// Size is the region size in bytes.
func (c *Client) Size() int64 { return c.size }

// Close ends the session: every connection is closed.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.qmu.Lock()
	qs := make([]*QueuePair, 0, len(c.queues))
	for _, q := range c.queues {
		qs = append(qs, q)
	}
	c.qmu.Unlock()
	for _, q := range qs {
		_ = q.Close()
	}
	c.sync.close()
	for _, s := range c.streams {
		s.close()
	}
	if c.ctrl != nil {
		c.endControl()
		_ = c.ctrl.Close()
		<-c.ctrlDone
	}
	return nil
}

// closeWait bounds how long Close waits for the donor to end the session.
const closeWait = time.Second

// endControl half-closes the control connection and waits (at most
// closeWait, or the request timeout if shorter) until the donor, having
// read its end, has ended the session and closed its side: once Close
// returns, the region takes a new session at once, where a Dial racing
// the donor's reading of the end was refused as a second subscriber
// (protocol.ErrBusy).
func (c *Client) endControl() {
	cw, ok := c.ctrl.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	t := time.NewTimer(min(closeWait, c.opts.Timeout))
	defer t.Stop()
	select {
	case <-c.ctrlDone:
	case <-t.C:
	}
}

func (c *Client) check(n int, off int64) error {
	if off < 0 || int64(n) > c.size || off > c.size-int64(n) {
		return fmt.Errorf("%w: [%d,+%d) in region of %d bytes", protocol.ErrOutOfRange, off, n, c.size)
	}
	return c.err()
}

// Read fills p from the region at off over channel ch.
func (c *Client) Read(ctx context.Context, ch Channel, p []byte, off int64) error {
	return c.do(ctx, ch, protocol.OpRead, p, off)
}

// Write stores p in the region at off over channel ch.
func (c *Client) Write(ctx context.Context, ch Channel, p []byte, off int64) error {
	return c.do(ctx, ch, protocol.OpWrite, p, off)
}

func (c *Client) do(ctx context.Context, ch Channel, op uint8, p []byte, off int64) error {
	if err := c.check(len(p), off); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	if ch == ChannelAdaptive {
		c.inflight.Add(1)
		defer c.inflight.Add(-1)
		ch = c.choose(len(p))
	}
	switch ch {
	case ChannelSync:
		c.syncBusy.Add(1)
		defer c.syncBusy.Add(-1)
		return c.sync.do(ctx, c, op, p, off)
	case ChannelBulk:
		return c.bulk(ctx, op, p, off)
	case ChannelQueue:
		return c.qp.do(ctx, op, p, off, c.opts.QueueChunk)
	}
	return fmt.Errorf("memory: unknown channel %d", ch)
}

// choose is the adaptive policy, from the request size and the recent access
// pattern. Requests of at least BulkThreshold take the bulk channel. While
// requests do not overlap, the rest take the synchronous channel (one round
// trip per MaxPayload, no goroutine hand-offs). Once requests overlap — a
// concurrent pattern, remembered for concurrencyMemory — small requests are
// pipelined on the queue pair instead of queueing for the synchronous
// connection, and larger ones take the bulk streams.
//
// A caller alone with no overlap remembered reads no clock: lastOverlap is
// 0 then (it is cleared once its memory has passed), so that one thread's
// requests run the synchronous channel's code plus four atomic operations.
func (c *Client) choose(n int) Channel {
	if n >= c.opts.BulkThreshold {
		return ChannelBulk
	}
	overlap := c.inflight.Load() > 1 || c.syncBusy.Load() > 0
	if overlap {
		c.lastOverlap.Store(monoNow())
	} else if last := c.lastOverlap.Load(); last != 0 {
		if monoNow()-last < int64(concurrencyMemory) {
			overlap = true
		} else {
			c.lastOverlap.CompareAndSwap(last, 0) // forgotten
		}
	}
	switch {
	case !overlap:
		return ChannelSync
	case n <= c.opts.QueueChunk:
		return ChannelQueue
	default:
		return ChannelBulk
	}
}

// concurrencyMemory is how long the adaptive chooser remembers overlapping
// requests.
const concurrencyMemory = 2 * time.Millisecond

// monoEpoch is the origin of monoNow.
var monoEpoch = time.Now()

// monoNow is the monotonic clock in nanoseconds since monoEpoch, at least
// 1 (0 is "never" in Client.lastOverlap): one clock reading where
// time.Now takes two (wall and monotonic), immune to steps of the wall
// clock.
func monoNow() int64 { return int64(time.Since(monoEpoch)) + 1 }

// ReadAt implements io.ReaderAt over the adaptive channel with the client's
// request timeout. Reads past the end return io.EOF.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	n := len(p)
	var eof error
	if off >= 0 && off+int64(n) > c.size {
		if off >= c.size {
			return 0, io.EOF
		}
		n = int(c.size - off)
		eof = io.EOF
	}
	if err := c.Read(context.Background(), ChannelAdaptive, p[:n], off); err != nil {
		return 0, err
	}
	return n, eof
}

// WriteAt implements io.WriterAt over the adaptive channel.
func (c *Client) WriteAt(p []byte, off int64) (int, error) {
	if err := c.Write(context.Background(), ChannelAdaptive, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// deadline is the earlier of ctx's deadline and now+timeout.
func (c *Client) deadline(ctx context.Context) time.Time {
	dl := time.Now().Add(c.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		return d
	}
	return dl
}

// respErr turns a response with a non-OK status (message already read) or a
// transport error into the error returned to callers.
func transportErr(err error) error {
	if errors.Is(err, protocol.ErrBadFrame) {
		return err
	}
	return fmt.Errorf("%w: %v", protocol.ErrDonorLost, err)
}

// syncConn is the fine-grained synchronous channel: one connection, one
// request at a time, no allocation per request. It drives the socket with
// raw syscalls and poll(2) from the calling goroutine (see rawconn), which
// saves the netpoller's wake-up on every round trip. A connection that
// breaks is re-established alone (rejoin.go).
type syncConn struct {
	link
}

func (s *syncConn) do(ctx context.Context, c *Client, op uint8, p []byte, off int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.ready(ctx, c); err != nil {
		return err
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, s.shutdown)
		defer stop()
	}
	tries := 0
	for len(p) > 0 {
		n := min(len(p), protocol.MaxPayload)
		if err := s.pg.Load().Do(op, p[:n], off); err != nil {
			if errors.Is(err, protocol.ErrOutOfRange) {
				return err
			}
			// The part [off, off+n) is sent again on a new connection
			// if the donor ended this one (rejoin.go); the parts before
			// it were acknowledged.
			again, err := s.recover(ctx, c, s.broke(ctx, err), &tries)
			if !again {
				return err
			}
			continue
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// readStatus consumes an error response's message and returns its error.
func readStatus(r io.Reader, h protocol.Header) error {
	msg := make([]byte, h.Payload)
	if _, err := io.ReadFull(r, msg); err != nil {
		return transportErr(err)
	}
	return protocol.StatusError(h.Status, msg)
}
