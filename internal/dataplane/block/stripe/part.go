package stripe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pki"
)

// ErrLostWrites is returned by a Flush when a connection to a part broke
// while it had writes no flush had covered yet: the lender may have
// restarted without them. The flush itself was done on the new connection,
// so writes made after the reconnection are durable once it succeeds.
var ErrLostWrites = errors.New("stripe: connection to a part broke with unflushed writes; they may be lost")

// ErrPartEnded, wrapped by an error of AttachConfig.Resolve, says that the
// part will not be served anywhere again (its lease ended: released,
// expired, lost): a part whose redial asks Resolve and hears it is not
// redialled further.
var ErrPartEnded = errors.New("stripe: the part's lease ended")

// The floor and ceiling of the backoff between redial attempts (internal/backoff).
const (
	redialFirstWait = 20 * time.Millisecond
	redialMaxWait   = 500 * time.Millisecond
)

// The floor and ceiling of the backoff between the attempts to reach a
// part given up during an outage (revive).
var (
	reviveFirstWait = 250 * time.Millisecond
	reviveMaxWait   = 5 * time.Second
)

// resolveSummaryEvery is how often the failures to resolve a part's URI
// after the first (logged with its cause) are summed up in one line.
const resolveSummaryEvery = 10 * time.Second

// nbdPart is one connection to a part. Trim is usable only if the server said
// so. When the connection breaks (the lender closed it or restarted: the
// client reports nbd.ErrClosed), the call redials the same URI, with
// backoff, for at most redial, and is retried once on the new connection;
// reads and writes of whole ranges are idempotent, so a retry is safe. If
// the redial gives up, or a request times out (a lender that hangs is the
// Volume's business: it fails the part), the connection is dead: Alive
// reports false, so a Pool stops choosing it, and calls fail at once. A
// redial whose handshake finds the lender's certificate revoked gives up
// at once, unless the part moved (resolve): a connection the revocation
// list's tracker ended (AttachConfig.Track) is not redialled for nothing.
// So does one whose resolve says the part ended (ErrPartEnded): its lease
// is over, and no lender will serve it again. A redial that gives up for
// want of an answer (the lender, or the control plane resolve asks, was
// unreachable for the whole redial) is not final: calls fail at once,
// saying so, while a goroutine of the part tries again with a longer
// backoff (revive), until it reconnects (the part is alive again), finds
// the part ended or its lender revoked, or Close.
type nbdPart struct {
	uri     nbd.URI                                             // guarded by mu once attached (reconnect may move it)
	tls     func() *tls.Config                                  // for a TLS URI, at each dial (see AttachConfig.TLS)
	track   pki.TrackFunc                                       // each TLS connection, nil: none (see AttachConfig.Track)
	index   int                                                 // part index, for logs
	timeout time.Duration                                       // per request, passed to nbd.Dial
	redial  time.Duration                                       // 0: never redial
	resolve func(ctx context.Context, part int) (string, error) // nil: keep uri
	log     *slog.Logger
	size    int64
	flags   uint16 // of the first connection
	meta    bool   // the first connection negotiated base:allocation

	redialMu     sync.Mutex
	redialCancel context.CancelFunc // the redial under way's; Close calls it
	reviveCancel context.CancelFunc // the revive goroutine's; Close calls it

	// down is why the part is dead while revive tries to reach it again
	// (nil: it is not, or for good); calls fail with it at once.
	down atomic.Pointer[error]
	// rlog is what has been logged of the failures to resolve the
	// part's URI.
	rlog resolveLog

	mu     sync.Mutex // serialises redials
	cur    atomic.Pointer[nbd.Client]
	dead   atomic.Bool
	closed atomic.Bool

	// Completed writes (and trims, zeroings) and the count a successful
	// flush covered, to tell whether a broken connection lost anything.
	wseq    atomic.Uint64
	flushed atomic.Uint64
	// Losses found (a connection broke with writes no flush had
	// covered) and how many a flush has reported: a flush reports
	// the losses found before it ended that no flush had reported when
	// it began (Linux's errseq), so that every flush under way hears of
	// one, and the next to begin does.
	lostGen, lostSeen atomic.Uint64
	// lostRep is the report of the latest loss, stored before lostGen
	// counts it: every flush that takes it gets this value (lossReport).
	lostRep atomic.Pointer[lossReport]
	epoch   atomic.Uint64 // counts reconnections
	// breaking is the connection the latest reconnection replaces (or
	// replaced); moved says whether that reconnection found the part
	// moved (guarded by mu). See count.
	breaking atomic.Pointer[nbd.Client]
	moved    bool
	// Flushes sent on the part (or, through a pool, for it: sharedFlush),
	// numbered, and the highest number that succeeded on each of the
	// latest two connections: a write answered before flush number n
	// was sent on its connection is durable once n succeeded there (NBD:
	// a flush covers the writes answered before it was sent), which
	// lateWrite needs to know.
	fsent atomic.Uint64
	okMu  sync.Mutex
	ok    [2]flushed

	beforeCount  func() // for tests: called before a write answered is counted (count)
	beforeReport func() // for tests: called when a flush has succeeded, before it reports losses
}

// flushed is the highest-numbered flush (nbdPart.fsent) that succeeded on
// connection c.
type flushed struct {
	c *nbd.Client
	n uint64
}

// flushTicket is a flush about to be sent for a part: its number and the
// connection whose writes it covers.
type flushTicket struct {
	p *nbdPart
	flushed
}

func newPart(c *nbd.Client, u nbd.URI, tlsCfg func() *tls.Config, track pki.TrackFunc, index int, timeout, redial time.Duration,
	resolve func(context.Context, int) (string, error), log *slog.Logger) *nbdPart {
	p := &nbdPart{uri: u, tls: tlsCfg, track: track, index: index, timeout: timeout, redial: redial, resolve: resolve, log: log,
		size: c.Size(), flags: c.Flags(), meta: c.CanExtents()}
	p.cur.Store(c)
	return p
}

func (p *nbdPart) Size() int64   { return p.size }
func (p *nbdPart) CanTrim() bool { return p.flags&nbd.FlagSendTrim != 0 }

// MultiConnSafe reports whether the server makes a flush on this connection
// cover writes completed on the others.
func (p *nbdPart) MultiConnSafe() bool { return p.flags&nbd.FlagCanMultiConn != 0 }

// requestTimeout implements selfTimer: the connection's client fails a
// request that misses it with nbd.ErrTimeout.
func (p *nbdPart) requestTimeout() time.Duration { return p.timeout }

// Alive implements the Pool's liveness check.
func (p *nbdPart) Alive() bool { return !p.dead.Load() }

// call runs f on the current connection, redialling and retrying once if
// the connection broke.
func (p *nbdPart) call(write bool, f func(*nbd.Client) error) error {
	c := p.cur.Load()
	return p.finish(write, c, f(c), f)
}

// finish completes a call whose first attempt, on c, returned err: if c
// broke it redials and retries f once on the new connection.
func (p *nbdPart) finish(write bool, c *nbd.Client, err error, f func(*nbd.Client) error) error {
	// The flushes sent before the write's reply came (for lateWrite).
	// Taken once its call has returned, a little after the reply was
	// read: a flush sent in between counts as sent before, which can only
	// make lateWrite report a loss, never miss one.
	answered := p.fsent.Load()
	if err != nil && errors.Is(err, nbd.ErrClosed) && !p.closed.Load() {
		var rerr error
		if c, rerr = p.reconnect(c); rerr != nil {
			return rerr
		}
		err = f(c)
		answered = p.fsent.Load()
	}
	if errors.Is(err, nbd.ErrTimeout) {
		p.dead.Store(true)
	}
	if err == nil && write && !p.count(c) {
		p.lateWrite(c, answered)
	}
	return err
}

// count counts a write that c's lender answered. It reports false when
// a reconnection has replaced c, or is replacing it, and so may have
// looked for unflushed writes before this one was counted (the reply was
// read, then the connection broke, and another call reconnected before
// this write's caller ran): lateWrite must then decide whether it is lost.
// (A reconnection marks breaking before it counts; a write is counted
// before it looks at breaking: one of them sees the other.)
func (p *nbdPart) count(c *nbd.Client) bool {
	if p.beforeCount != nil {
		p.beforeCount()
	}
	p.wseq.Add(1)
	return p.breaking.Load() != c && p.cur.Load() == c
}

// lateWrite counts a write answered on c, which a reconnection from c may
// have missed (count), as lost unless the reconnection found the part
// moved, as reconnect would have, or a flush sent on c after the write
// was answered (numbered above answered: the flushes sent until its call
// returned) has succeeded there, which made it durable before the
// connection broke. It waits for the reconnection under way. Not on the
// goroutine that reads c's replies (reconnect closes c, which waits for
// that goroutine).
func (p *nbdPart) lateWrite(c *nbd.Client, answered uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.flushedSince(c, answered) {
		return
	}
	if !p.moved || p.cur.Load() == c {
		p.lose()
	}
}

// lose records a loss of writes (see lostGen) and its report.
func (p *nbdPart) lose() {
	p.lostRep.Store(&lossReport{fmt.Errorf("part %d: %w", p.index, ErrLostWrites)})
	p.lostGen.Add(1)
}

// ticket numbers a flush about to be sent on c, which covers the part's
// writes answered on c before it.
func (p *nbdPart) ticket(c *nbd.Client) flushTicket {
	return flushTicket{p: p, flushed: flushed{c: c, n: p.fsent.Add(1)}}
}

// succeeded records that the flush of t succeeded on t's connection.
func (t flushTicket) succeeded() {
	p := t.p
	p.okMu.Lock()
	defer p.okMu.Unlock()
	for i := range p.ok {
		if p.ok[i].c == t.c {
			p.ok[i].n = max(p.ok[i].n, t.n)
			return
		}
	}
	// A connection not seen yet (the first flush after a reconnection):
	// it replaces the older of the two.
	p.ok[0], p.ok[1] = p.ok[1], t.flushed
}

// flushedSince reports whether a flush numbered above n succeeded on c.
func (p *nbdPart) flushedSince(c *nbd.Client, n uint64) bool {
	p.okMu.Lock()
	defer p.okMu.Unlock()
	for _, f := range p.ok {
		if f.c == c && f.n > n {
			return true
		}
	}
	return false
}

// reconnect replaces the broken connection old, unless another call already
// has, and returns the connection to use. A part that turns out to have
// moved — Resolve gives another export name: a lender restarting serves
// the same one, a move a new one — had its writes copied where it is now
// (a lender retires an export only once its copy is served and durable),
// so none counts as lost.
func (p *nbdPart) reconnect(old *nbd.Client) (*nbd.Client, error) {
	if d := p.down.Load(); d != nil && p.dead.Load() && p.cur.Load() == old {
		// Given up during an outage: revive holds mu while it tries
		// again; fail at once rather than wait for it.
		return nil, *d
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.cur.Load(); c != old {
		return c, nil
	}
	p.breaking.Store(old)
	if p.dead.Load() || p.redial <= 0 || p.closed.Load() {
		p.dead.Store(true)
		if d := p.down.Load(); d != nil {
			return nil, *d
		}
		return nil, fmt.Errorf("stripe: part %d: %w", p.index, nbd.ErrClosed)
	}
	old.Close()
	unflushed := p.wseq.Load() > p.flushed.Load()
	from := p.uri
	ctx, cancel := context.WithTimeout(context.Background(), p.redial)
	defer cancel()
	if !p.setRedial(cancel) {
		p.dead.Store(true)
		return nil, fmt.Errorf("stripe: part %d: %w", p.index, nbd.ErrClosed)
	}
	defer p.setRedial(nil)
	start := time.Now()
	retry := backoff.Backoff{Min: redialFirstWait, Max: redialMaxWait}
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			if err := p.follow(ctx); err != nil {
				if unflushed {
					p.lose()
				}
				p.dead.Store(true)
				p.log.Error("stripe: the part's lease ended: not reconnecting", "part", p.index, "addr", p.uri.Address, "attempts", attempt-1, "err", err)
				return nil, fmt.Errorf("stripe: part %d: %w: %w", p.index, nbd.ErrClosed, err)
			}
		}
		actx, acancel := context.WithTimeout(ctx, dialAttemptLimit)
		c, err := p.uri.Dial(actx, dialTLS(p.tls), nbd.WithRequestTimeout(p.timeout), nbd.WithTrack(p.track))
		acancel()
		if err == nil && c.Size() != p.size {
			c.Close()
			p.dead.Store(true)
			return nil, fmt.Errorf("%w: part %d: export size changed from %d to %d after reconnecting", ErrDeviceFailed, p.index, p.size, c.Size())
		}
		if err == nil {
			p.moved = p.uri.Export != from.Export
			if unflushed && !p.moved {
				p.lose()
			}
			p.epoch.Add(1)
			p.cur.Store(c)
			if p.closed.Load() {
				c.Close()
				return nil, fmt.Errorf("stripe: part %d: %w", p.index, nbd.ErrClosed)
			}
			p.log.Info("stripe: reconnected to part", "part", p.index, "addr", p.uri.Address, "attempts", attempt, "after", time.Since(start))
			return c, nil
		}
		if errors.Is(err, pki.ErrRevoked) {
			// The lender's certificate is revoked (a node removed, its
			// certificate revoked by an operator): no redial will verify
			// it, unless the part moved to another lender.
			at := p.uri
			ferr := p.follow(ctx)
			if p.uri == at || ferr != nil {
				if unflushed {
					p.lose()
				}
				p.dead.Store(true)
				p.log.Error("stripe: the part's lender presents a revoked certificate: not reconnecting", "part", p.index, "addr", p.uri.Address, "attempts", attempt, "err", err)
				return nil, fmt.Errorf("stripe: part %d: %w: its lender's certificate is revoked: %w", p.index, nbd.ErrClosed, err)
			}
		}
		if retry.Wait(ctx) != nil {
			if unflushed {
				p.lose()
			}
			// Dial errors do not quote the export name.
			gaveUp := fmt.Errorf("stripe: part %d: reconnecting for %v: %w (last attempt: %w)", p.index, p.redial, nbd.ErrClosed, err)
			if p.closed.Load() {
				p.dead.Store(true)
				return nil, gaveUp
			}
			down := fmt.Errorf("stripe: part %d: unreachable since %s, trying again in the background: %w (last attempt: %w)",
				p.index, start.Format(time.RFC3339), nbd.ErrClosed, err)
			p.down.Store(&down)
			p.dead.Store(true)
			p.log.Error("stripe: gave up reconnecting to part; trying again in the background", "part", p.index, "addr", p.uri.Address,
				"attempts", attempt, "after", time.Since(start), "err", err)
			p.startRevive()
			return nil, gaveUp
		}
	}
}

// dialAttemptLimit bounds one redial attempt, so that an address where
// something else now listens (and never answers the NBD greeting) does not
// take the whole redial budget.
const dialAttemptLimit = 2 * time.Second

// follow asks resolve (if set) for the part's current URI and moves to it
// when it changed and parses; p.mu is held. Failures keep the old URI: the
// next attempt asks again. It returns resolve's error only when it says
// the part ended (ErrPartEnded): no attempt will find it served.
func (p *nbdPart) follow(ctx context.Context) error {
	u, err := p.lookup(ctx, p.uri)
	if err != nil {
		return err
	}
	p.moveTo(u)
	return nil
}

// lookup asks resolve (if set) for the part's current URI: at, the URI
// it had, when resolve fails or answers a malformed one. It returns
// resolve's error only when it says the part ended (ErrPartEnded).
func (p *nbdPart) lookup(ctx context.Context, at nbd.URI) (nbd.URI, error) {
	if p.resolve == nil {
		return at, nil
	}
	rctx, cancel := context.WithTimeout(ctx, dialAttemptLimit)
	defer cancel()
	s, err := p.resolve(rctx, p.index)
	if errors.Is(err, ErrPartEnded) {
		return at, err
	}
	if err != nil {
		p.rlog.failed(p.log, p.index, err, time.Now())
		return at, nil
	}
	p.rlog.answered(p.log, p.index, time.Now())
	u, err := nbd.ParseURI(s)
	if err != nil {
		// The URI holds the credential: never quote it.
		p.log.Warn("stripe: resolved a malformed URI for part", "part", p.index)
		return at, nil
	}
	return u, nil
}

// moveTo makes u the part's URI (p.mu held).
func (p *nbdPart) moveTo(u nbd.URI) {
	if u != p.uri {
		p.log.Info("stripe: part moved", "part", p.index, "from", p.uri.Address, "to", u.Address)
		p.uri = u
	}
}

func (p *nbdPart) ReadAt(b []byte, off int64) (n int, err error) {
	err = p.call(false, func(c *nbd.Client) error {
		n, err = c.ReadAt(b, off)
		return err
	})
	return n, err
}

func (p *nbdPart) WriteAt(b []byte, off int64) (n int, err error) {
	err = p.call(true, func(c *nbd.Client) error {
		n, err = c.WriteAt(b, off)
		return err
	})
	return n, err
}

func (p *nbdPart) Trim(off, n int64) error {
	return p.call(true, func(c *nbd.Client) error { return c.Trim(off, n) })
}

func (p *nbdPart) WriteZeroes(off, n int64, noHole bool) error {
	return p.call(true, func(c *nbd.Client) error { return c.WriteZeroes(off, n, noHole) })
}

// CanExtents reports whether the lender offers base:allocation.
func (p *nbdPart) CanExtents() bool { return p.meta }

// Extents asks the lender which ranges are holes.
func (p *nbdPart) Extents(off, n int64) (ext []nbd.Extent, err error) {
	err = p.call(false, func(c *nbd.Client) error {
		ext, err = c.Extents(off, n)
		return err
	})
	return ext, err
}

// Flush flushes the current connection. If an earlier connection broke with
// writes no flush had covered, it reports ErrLostWrites (see lostGen).
func (p *nbdPart) Flush() error { return p.flushSince(p.lostSeen.Load()) }

// flushSince implements lostReporter: Flush for a flush that began when
// lostSeen was seen.
func (p *nbdPart) flushSince(seen uint64) error {
	// As startFlush, without its closure (an allocation per flush).
	seq := p.wseq.Load()
	c := p.cur.Load()
	t := p.ticket(c)
	err := c.Flush()
	if err == nil {
		t.succeeded()
	}
	return p.endFlush(seq, seen, p.finish(false, c, err, (*nbd.Client).Flush))
}

// lostMark implements lostReporter.
func (p *nbdPart) lostMark() uint64 { return p.lostSeen.Load() }

// startFlush implements flushStarter: it sends the flush and returns what
// awaits it (and, if the connection broke, redials and flushes again), as
// Flush does.
func (p *nbdPart) startFlush() func() error {
	seq, seen := p.wseq.Load(), p.lostSeen.Load()
	c := p.cur.Load()
	t := p.ticket(c)
	s := c.StartFlush()
	return func() error {
		err := s.Wait()
		if err == nil {
			t.succeeded()
		}
		return p.endFlush(seq, seen, p.finish(false, c, err, (*nbd.Client).Flush))
	}
}

// endFlush ends a flush sent when seq writes had completed and lostSeen
// was seen, whose outcome (after a redial and retry, finish) is err.
func (p *nbdPart) endFlush(seq, seen uint64, err error) error {
	if err != nil {
		return err
	}
	p.flushedUpTo(seq)
	if p.beforeReport != nil {
		p.beforeReport()
	}
	return p.lostSince(seen)
}

// lostSince returns the report of the latest loss (wrapping
// ErrLostWrites) if losses were found that no flush had reported when
// lostSeen was seen, and records them reported; nil otherwise.
func (p *nbdPart) lostSince(seen uint64) error {
	gen := p.lostGen.Load()
	if gen <= seen {
		return nil
	}
	for {
		s := p.lostSeen.Load()
		if s >= gen || p.lostSeen.CompareAndSwap(s, gen) {
			// Stored before gen was counted: this loss's report, or
			// a later one's (which answers for it too).
			return p.lostRep.Load()
		}
	}
}

// flushSnapshot implements sharedFlusher.
func (p *nbdPart) flushSnapshot() (seq, epoch uint64, export nbd.URI, ok bool) {
	p.mu.Lock() // p.uri moves with a reconnection
	export = p.uri
	p.mu.Unlock()
	// What the URI's text says (a struct, not its String: that allocated
	// on every flush).
	export.ServerName = ""
	return p.wseq.Load(), p.epoch.Load(), export, p.Alive() && p.lostGen.Load() == p.lostSeen.Load()
}

// flushTicket implements sharedFlusher.
func (p *nbdPart) flushTicket() flushTicket { return p.ticket(p.cur.Load()) }

// flushedUpTo implements sharedFlusher: the first seq writes are durable.
func (p *nbdPart) flushedUpTo(seq uint64) {
	for {
		f := p.flushed.Load()
		if f >= seq || p.flushed.CompareAndSwap(f, seq) {
			return
		}
	}
}

// Close closes the connection and stops any redial; calls in progress
// return.
func (p *nbdPart) Close() error {
	p.closed.Store(true)
	p.redialMu.Lock()
	if p.redialCancel != nil {
		p.redialCancel()
	}
	if p.reviveCancel != nil {
		p.reviveCancel()
	}
	p.redialMu.Unlock()
	return p.cur.Load().Close()
}

// startRevive starts the goroutine that tries to reach a part given up
// during an outage again (revive), unless Close has been called.
func (p *nbdPart) startRevive() {
	ctx, cancel := context.WithCancel(context.Background())
	p.redialMu.Lock()
	if p.closed.Load() {
		p.redialMu.Unlock()
		cancel()
		return
	}
	if p.reviveCancel != nil {
		p.reviveCancel() // the last one's, which has ended (it revived the part)
	}
	p.reviveCancel = cancel
	p.redialMu.Unlock()
	go p.revive(ctx)
}

// revive tries, with backoff, to reconnect a part given up during an
// outage (down is set) until it does, the part turns out to be over
// (its lease ended, its lender revoked, its size changed), or ctx ends
// (Close).
func (p *nbdPart) revive(ctx context.Context) {
	retry := backoff.Backoff{Min: reviveFirstWait, Max: reviveMaxWait}
	for attempt := 1; ; attempt++ {
		if retry.Wait(ctx) != nil {
			return
		}
		if p.reviveOnce(ctx, attempt) {
			return
		}
	}
}

// reviveOnce is one attempt of revive: it asks resolve where the part is
// and dials it. It reports whether revive is over. It holds p.mu only
// to read and replace the URI and the connection, not while it waits
// for the network: flushes of the part's pool read the URI
// (flushSnapshot).
func (p *nbdPart) reviveOnce(ctx context.Context, attempt int) bool {
	p.mu.Lock()
	from := p.uri
	p.mu.Unlock()
	final := func(msg string, addr string, err error) bool {
		p.down.Store(nil)
		p.log.Error(msg, "part", p.index, "addr", addr, "attempts", attempt, "err", err)
		return true
	}
	u, err := p.lookup(ctx, from)
	if err != nil {
		return final("stripe: the part's lease ended: not reconnecting", from.Address, err)
	}
	actx, acancel := context.WithTimeout(ctx, dialAttemptLimit)
	c, err := u.Dial(actx, dialTLS(p.tls), nbd.WithRequestTimeout(p.timeout), nbd.WithTrack(p.track))
	acancel()
	switch {
	case err == nil && c.Size() != p.size:
		c.Close()
		return final("stripe: the part's export size changed: not reconnecting", u.Address,
			fmt.Errorf("%w: part %d: export size changed from %d to %d after reconnecting", ErrDeviceFailed, p.index, p.size, c.Size()))
	case errors.Is(err, pki.ErrRevoked) && u == from:
		// (A lender revoked where the part was: the next attempt asks
		// again where it is, in case it moves.)
		return final("stripe: the part's lender presents a revoked certificate: not reconnecting", u.Address, err)
	case err != nil:
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.moveTo(u)
	p.moved = u.Export != from.Export
	p.epoch.Add(1)
	p.cur.Store(c)
	if p.closed.Load() {
		c.Close()
		return true
	}
	p.down.Store(nil)
	p.dead.Store(false)
	p.log.Info("stripe: reconnected to part given up earlier", "part", p.index, "addr", p.uri.Address, "attempts", attempt)
	return true
}

// resolveLog is what has been logged of a part's failures to resolve its
// URI: the first of a run at WARN with its cause, the later ones counted
// and summed up once resolveSummaryEvery has passed since the last line
// (a control plane down for minutes is asked at each redial attempt).
type resolveLog struct {
	mu       sync.Mutex
	logged   bool      // the first failure of the run was logged
	n        int       // failures since, not logged
	since    time.Time // when the first of those n failed
	last     error     // the last of them
	summedAt time.Time // when the first failure or the last summary was logged
}

// failed logs a failure err to resolve part's URI at now, or counts it.
func (r *resolveLog) failed(log *slog.Logger, part int, err error, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.logged {
		r.logged, r.summedAt = true, now
		log.Warn("stripe: could not resolve part's URI (further failures are counted, not logged one by one)", "part", part, "err", err)
		return
	}
	if r.n == 0 {
		r.since = now
	}
	r.n++
	r.last = err
	if now.Sub(r.summedAt) >= resolveSummaryEvery {
		r.sumUp(log, part, now)
	}
}

// answered ends a run of failures: those not logged yet are summed up.
func (r *resolveLog) answered(log *slog.Logger, part int, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sumUp(log, part, now)
	r.logged = false
}

// sumUp logs the failures counted since the last line, if any (r.mu held).
func (r *resolveLog) sumUp(log *slog.Logger, part int, now time.Time) {
	if r.n == 0 {
		return
	}
	log.Warn(fmt.Sprintf("stripe: %d more failures to resolve part's URI since %s", r.n, r.since.Format(time.RFC3339)),
		"part", part, "failed", r.n, "since", r.since, "err", r.last)
	r.n, r.last, r.summedAt = 0, nil, now
}

// setRedial records the cancel function of the redial under way (nil:
// none), which Close calls; it refuses one once Close has been called.
func (p *nbdPart) setRedial(cancel context.CancelFunc) bool {
	p.redialMu.Lock()
	defer p.redialMu.Unlock()
	if cancel != nil && p.closed.Load() {
		return false
	}
	p.redialCancel = cancel
	return true
}

// canStartWrite implements asyncWriter.
func (p *nbdPart) canStartWrite() bool { return true }

// startWrite implements asyncWriter: b is sent on the current connection
// and done gets what WriteAt would have returned. A write that fails, or
// cannot be sent (a connection already broken, a write larger than the
// lender takes in one request), is finished on a goroutine of its own, as
// startRead does: never on the caller's (the local export's reader, which
// would stop reading every request of its client while one part redials,
// for up to the redial timeout) nor on the one that read its reply (which
// must not block, and whose connection a redial or the volume's failing of
// the part closes). There a broken connection is redialled and the write
// retried once, as WriteAt does. The write is in flight until done is
// called (a Pool counts it, the write-back cache orders overlapping
// requests behind it), and counts in wseq only once it has succeeded.
func (p *nbdPart) startWrite(b []byte, off int64, done func(error)) {
	write := func(c *nbd.Client) error {
		_, err := c.WriteAt(b, off)
		return err
	}
	c := p.cur.Load()
	err := c.StartWrite(b, off, func(err error) {
		if err == nil {
			answered := p.fsent.Load() // see finish
			if p.count(c) {
				done(nil)
				return
			}
			go func() { p.lateWrite(c, answered); done(nil) }()
			return
		}
		go func() { done(p.finish(true, c, err, write)) }()
	})
	if err != nil {
		go func() {
			if errors.Is(err, nbd.ErrTooLarge) {
				err = write(c)
			}
			done(p.finish(true, c, err, write))
		}()
	}
}
