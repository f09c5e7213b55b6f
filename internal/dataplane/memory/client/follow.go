package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/pki"
)

// A memory lease may move to another donor while it is used (the Device
// Lending paper's live migration; docs/operations.md, "Moving leases and
// draining nodes"). At the switch the old donor retires the region: the
// writes it held are answered GONE, its session's connections close, and
// no session is admitted there any more. A Following is a session that
// follows the region to its new place: a request that ends that way asks
// the Relocator where the region is now (the control plane's record of
// the lease), opens a session there and is retried. Reads and writes of
// whole ranges are idempotent, so a request retried after the switch
// leaves the region as if it had run once.
//
// A donor whose certificate is revoked (its node removed, its
// certificate revoked by an operator) is not dialled again for nothing:
// a session the revocation list's tracker ended (Options.Track) is
// opened again only where the region is then; if that is the same donor,
// the handshake fails against the list, and the follow gives up at once
// (an error wrapping pki.ErrRevoked, logged), rather than redialling for
// FollowConfig.Timeout. From then on that donor is never dialled again:
// a request that finds the session lost fails at once unless the
// Relocator has moved the region elsewhere.

// Relocator says where a region is now: its donor's address and the
// credential to present (the lease's current URI). An error wrapping
// ErrEnded stops following at once (the lease ended); other errors are
// retried until FollowConfig.Timeout.
type Relocator func(ctx context.Context) (addr, credential string, err error)

// ErrEnded is what a Relocator answers when the region's lease ended: the
// request's own error stands.
var ErrEnded = errors.New("memory: the region's lease ended")

// FollowConfig configures a Following.
type FollowConfig struct {
	// Relocate is required.
	Relocate Relocator
	// Timeout bounds one follow: how long a request waits for the region's
	// new place and a session there (default 10 s).
	Timeout time.Duration
	// Clock times the waits between attempts (internal/backoff); nil:
	// the real clock.
	Clock clock.Clock
	// TLS, if set, returns the client configuration a follow opens a
	// session over TLS with, in place of Options.TLS (a session over TLS
	// only: Options.TLS set), called at each follow: a borrower whose CA
	// certificates change while it runs (a CA rotation it follows)
	// verifies the region's new place, a donor renewed from the new CA,
	// with those in use then.
	TLS    func() *tls.Config
	Logger *slog.Logger
}

// The floor and ceiling of the backoff between attempts to find and open
// the region's new place (internal/backoff).
const (
	followFirstWait = 20 * time.Millisecond
	followMaxWait   = 500 * time.Millisecond
)

// maxFollows bounds the follows one request may cause.
const maxFollows = 3

// Following is a session with a region that follows the region when it
// moves (see above): the Client of the region's current place, replaced
// when a request finds the region gone, its donor lost or its session
// closed. Requests, Join and Rejoin are safe for concurrent use; a
// request under way on a session being replaced is retried on the new one.
// Queue pairs made with Client().NewQueuePair end with their session.
//
// Build it with DialFollowing; Close ends it.
type Following struct {
	opts  Options
	cfg   FollowConfig
	log   *slog.Logger
	size  int64
	cur   atomic.Pointer[place]
	moves atomic.Int64

	mu     sync.Mutex // serialises follows
	closed atomic.Bool
	// recreated is set once a follow found the region created again at
	// its place (protocol.ErrRecreated): every request fails with it.
	recreated atomic.Pointer[error]
	// revoked is the donor a follow found presenting a revoked
	// certificate, and why (mu): never dialled again.
	revoked *revokedPlace
}

// revokedPlace is a donor whose certificate a follow found revoked.
type revokedPlace struct {
	addr string
	err  error
}

// place is the session at one of the region's places.
type place struct {
	c          *Client
	addr, cred string
	gen        uint64
}

// DialFollowing opens a session on the region of credential at addr (as
// Dial), which follows the region when it moves.
func DialFollowing(ctx context.Context, addr, credential string, opts Options, cfg FollowConfig) (*Following, error) {
	if cfg.Relocate == nil {
		return nil, errors.New("memory: a following session needs a Relocator")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := Dial(ctx, addr, credential, opts)
	if err != nil {
		return nil, err
	}
	f := &Following{opts: opts, cfg: cfg, log: cfg.Logger, size: c.Size()}
	f.cur.Store(&place{c: c, addr: addr, cred: credential})
	return f, nil
}

// Client is the session at the region's current place.
func (f *Following) Client() *Client { return f.cur.Load().c }

// Size is the region size in bytes (the same at every place).
func (f *Following) Size() int64 { return f.size }

// Timeout is the request timeout (Options.Timeout, filled).
func (f *Following) Timeout() time.Duration { return f.cur.Load().c.Timeout() }

// Moves is how many times the session followed the region to another
// place.
func (f *Following) Moves() int64 { return f.moves.Load() }

// Close ends the session.
func (f *Following) Close() error {
	f.closed.Store(true)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur.Load().c.Close()
}

// followable reports whether err may mean that the region moved (or that
// the session was replaced under the request).
func (f *Following) followable(err error) bool {
	if f.closed.Load() {
		return false
	}
	return errors.Is(err, protocol.ErrGone) || errors.Is(err, protocol.ErrDonorLost) || errors.Is(err, protocol.ErrClosed)
}

// do runs fn on the current session, following the region when fn fails
// because it moved.
func (f *Following) do(ctx context.Context, fn func(c *Client) error) error {
	if err := f.recreated.Load(); err != nil {
		return *err
	}
	for n := 0; ; n++ {
		p := f.cur.Load()
		err := fn(p.c)
		if err == nil || n == maxFollows || !f.followable(err) {
			return err
		}
		if ferr := f.follow(ctx, p.gen, true); ferr != nil {
			return errors.Join(err, ferr)
		}
	}
}

// Read fills p from the region at off over channel ch.
func (f *Following) Read(ctx context.Context, ch Channel, p []byte, off int64) error {
	return f.do(ctx, func(c *Client) error { return c.Read(ctx, ch, p, off) })
}

// Write stores p in the region at off over channel ch.
func (f *Following) Write(ctx context.Context, ch Channel, p []byte, off int64) error {
	return f.do(ctx, func(c *Client) error { return c.Write(ctx, ch, p, off) })
}

// ReadAt implements io.ReaderAt as Client.ReadAt does.
func (f *Following) ReadAt(p []byte, off int64) (int, error) {
	n := len(p)
	var eof error
	if off >= 0 && off+int64(n) > f.size {
		if off >= f.size {
			return 0, io.EOF
		}
		n = int(f.size - off)
		eof = io.EOF
	}
	if err := f.Read(context.Background(), ChannelAdaptive, p[:n], off); err != nil {
		return 0, err
	}
	return n, eof
}

// WriteAt implements io.WriterAt over the adaptive channel.
func (f *Following) WriteAt(p []byte, off int64) (int, error) {
	if err := f.Write(context.Background(), ChannelAdaptive, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Join opens one more connection of the current session (see
// Client.Join), following the region first if that session ended.
func (f *Following) Join(ctx context.Context, kind uint8) (net.Conn, error) {
	conn, _, err := f.JoinReplacing(ctx, kind, ConnRef{})
	return conn, err
}

// JoinReplacing is Join for a connection that replaces old (see
// Client.JoinReplacing): old is named only to the session it belongs
// to, not to one the session followed the region to since.
func (f *Following) JoinReplacing(ctx context.Context, kind uint8, old ConnRef) (net.Conn, ConnRef, error) {
	p := f.cur.Load()
	conn, ref, err := p.c.JoinReplacing(ctx, kind, old)
	if err == nil || !f.followable(err) {
		return conn, ref, err
	}
	if ferr := f.follow(ctx, p.gen, true); ferr != nil {
		return nil, ConnRef{}, errors.Join(err, ferr)
	}
	return f.cur.Load().c.JoinReplacing(ctx, kind, old)
}

// TLS reports whether the session runs over TLS (Options.TLS).
func (f *Following) TLS() bool { return f.opts.TLS != nil }

// DialHandoff is Client.DialHandoff on the session at the region's
// current place (a TLS mapping's fault connection), following the region
// first if that session ended.
func (f *Following) DialHandoff(ctx context.Context, kind uint8) (net.Conn, Handoff, error) {
	p := f.cur.Load()
	conn, h, err := p.c.DialHandoff(ctx, kind)
	if err == nil || !f.followable(err) {
		return conn, h, err
	}
	if ferr := f.follow(ctx, p.gen, true); ferr != nil {
		return nil, Handoff{}, errors.Join(err, ferr)
	}
	return f.cur.Load().c.DialHandoff(ctx, kind)
}

// RejoinHandoff is Rejoin for a session over TLS whose connection another
// process completes (a TLS mapping's fault handler; see Handoff): the
// region may have moved, so it asks where it is first and opens a session
// at its new place if it did — with Options.TLS, whose handshake verifies
// the new donor's certificate against the CA — then dials a connection
// there. The Handoff pins the key that new session verified, not the old
// donor's, and names old (Handoff.Replaces) if the session is still
// old's.
func (f *Following) RejoinHandoff(ctx context.Context, kind uint8, old ConnRef) (net.Conn, Handoff, error) {
	p := f.cur.Load()
	if err := f.follow(ctx, p.gen, p.c.err() != nil); err != nil {
		return nil, Handoff{}, err
	}
	conn, h, err := f.DialHandoff(ctx, kind)
	if err != nil {
		return nil, Handoff{}, err
	}
	if old.Session == h.Hello.Session {
		h.Replaces = old.ID
	}
	return conn, h, nil
}

// Rejoin is Join for a connection of the session that ended or was
// given up, old (its donor answered GONE or went away, or a request on
// it timed out): the region may have moved, so it asks where it is
// first, and opens a session at its new place if it did. If the session
// is still old's, the new connection names old, which the donor ends
// before it answers (see JoinReplacing). A mapping's fault handler gets
// its next connection this way.
func (f *Following) Rejoin(ctx context.Context, kind uint8, old ConnRef) (net.Conn, ConnRef, error) {
	p := f.cur.Load()
	if err := f.follow(ctx, p.gen, p.c.err() != nil); err != nil {
		return nil, ConnRef{}, err
	}
	return f.JoinReplacing(ctx, kind, old)
}

// follow replaces the session of generation gen by one at the region's
// current place, if it moved, or, when force (the session failed), by a
// new one at the same place. It does nothing if another call already
// replaced that session.
func (f *Following) follow(ctx context.Context, gen uint64, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed.Load() {
		return protocol.ErrClosed
	}
	if err := f.recreated.Load(); err != nil {
		return *err
	}
	p := f.cur.Load()
	if p.gen != gen {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	retry := backoff.Backoff{Min: followFirstWait, Max: followMaxWait, Clock: f.cfg.Clock}
	var why error // what failed last, not just the follow's deadline cutting an attempt short
	for {
		addr, cred, err := f.cfg.Relocate(ctx)
		if errors.Is(err, ErrEnded) {
			return err
		}
		if err == nil {
			moved := addr != p.addr || cred != p.cred
			if !moved && !force {
				return nil // the region is where it was; the session lives
			}
			if f.revoked != nil && f.revoked.addr == addr {
				return f.revoked.err
			}
			if !moved {
				// The same place: the donor admits one session at a time.
				_ = p.c.Close()
			}
			opts := f.opts
			if opts.TLS != nil && f.cfg.TLS != nil {
				if tc := f.cfg.TLS(); tc != nil {
					opts.TLS = tc
				}
			}
			var c *Client
			if c, err = Dial(ctx, addr, cred, opts); err == nil {
				if c.Size() != f.size {
					_ = c.Close()
					return fmt.Errorf("memory: the region at its new place has %d bytes, not %d", c.Size(), f.size)
				}
				if !moved && c.Generation() != p.c.Generation() {
					// The region at the same place is not the one the
					// session had: created again (its donor restarted), its
					// contents gone. Never served as if it were.
					_ = c.Close()
					err := fmt.Errorf("%w (at %s)", protocol.ErrRecreated, addr)
					f.recreated.Store(&err)
					f.log.Warn("memory region was recreated at its place; its contents are gone", "at", addr)
					return err
				}
				_ = p.c.Close()
				f.cur.Store(&place{c: c, addr: addr, cred: cred, gen: gen + 1})
				if moved {
					f.moves.Add(1)
					f.log.Info("memory region moved; following it", "to", addr)
				} else {
					f.log.Info("memory session opened again", "at", addr)
				}
				return nil
			}
			if errors.Is(err, pki.ErrRevoked) {
				// No redial will verify this donor: the region is
				// given up here, unless it moves elsewhere.
				f.revoked = &revokedPlace{addr: addr, err: fmt.Errorf("memory: the region's donor at %s presents a revoked certificate: %w", addr, err)}
				f.log.Error("memory: the region's donor presents a revoked certificate: not opening a session there again", "at", addr, "err", err)
				return f.revoked.err
			}
		}
		if why == nil || ctx.Err() == nil {
			why = err
		}
		if retry.Wait(ctx) != nil {
			return fmt.Errorf("memory: following the region: %w", why)
		}
	}
}
