package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rialto-project/rialto/internal/dataplane/memory/internal/rawconn"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// A data connection of a session (the sync connection, a bulk stream, a
// queue pair's) may end while the session lives: a donor moving the
// region closes the connection of a WRITE whose payload stalls, and only
// it (docs/memory-protocol.md, "A region that moved"). The client then
// re-establishes that connection alone — a HELLO of the same kind,
// presenting the session's credential and id, as when the session
// opened — and the session's other connections serve on, their requests
// undisturbed. The requests that were in flight on the lost connection
// are sent again on the new one, when the donor ended it (end of stream,
// reset) while the request's context lives, up to maxRejoins times per
// request; a request whose own deadline or context ended, or that met a
// timeout, fails as before (protocol.ErrDonorLost), and the connection is
// re-established by the next request that needs it. If the session
// itself ended (its control connection, or a HELLO refused: the region
// moved, was suspended or released) the request fails with the
// connection's error, and a Following follows the region as before.
//
// Sending a request again is safe:
//
//   - a READ reads the region again into the caller's buffer;
//   - a WRITE that was not acknowledged may or may not have been applied,
//     in whole or in part. Sent again it writes the same bytes to the same
//     range, which leaves the range as if it had been applied once: the
//     client promises no order between requests in flight together
//     (docs/memory-protocol.md, "Sequence numbers"), so a WRITE to the
//     same range from this client that came in between was in flight
//     together with the retried one, and either order is allowed; one
//     issued after the retried WRITE completed comes after the retry. What
//     could break this is a late part of the first attempt landing after
//     the retry; the donor rules that out: it answers the HELLO of a
//     session's new data connection only once the handlers of the
//     connections it closed itself have returned (donor.Donor's join
//     fence), and the client re-establishes a connection only after it
//     saw that connection's end.
//
// A connection the client gave up itself (a timeout, a cancelled
// request) may still be served by the donor, which does not know: the
// late rest of a WRITE's payload, or a WRITE a move's pause holds, would
// land after a WRITE to the same range acknowledged on the new
// connection, or on any other of the session. So every re-established
// connection names the one it replaces in its HELLO (its id, from that
// one's HELLO reply: protocol.ReplacedConnection); the donor ends it (a
// held WRITE gives up) and answers once its handler has returned. And a
// request that fails with its connection broken has that connection
// re-established before the failure is returned (link.settle; a queue
// pair's abandoned or failed WRITEs likewise: QueuePair.renew, fail):
// whatever the caller issues next, on any channel, is ordered after
// whatever the failed request did (docs/memory-protocol.md, "Sequence
// numbers"). A connection that cannot be re-established then leaves the
// session lost.
//
// Acknowledged writes are never sent again: a bulk stream goes on from
// its first unacknowledged chunk, a queue pair sends again only the
// requests still pending.

// maxRejoins bounds how many times one request re-establishes its
// connection.
const maxRejoins = 3

// Rejoins is how many data connections of the session were re-established
// after they broke (the session's other connections serving on).
func (c *Client) Rejoins() int64 { return c.rejoins.Load() }

// connEnded reports whether err (a transport error, before transportErr)
// is a connection's end its peer caused: the end of the stream, a reset,
// a broken pipe. Not a timeout, and not the client's own close of a
// net.Conn (net.ErrClosed). The client's own shutdown of a raw connection
// reads as an end too: callers check their context and the session first.
func connEnded(err error) bool {
	return errors.Is(err, rawconn.ErrPeerClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// kindName names a connection kind in errors.
func kindName(kind uint8) string {
	switch kind {
	case protocol.KindSync:
		return "sync"
	case protocol.KindBulk:
		return "bulk"
	case protocol.KindQueue:
		return "queue"
	}
	return fmt.Sprintf("kind %d", kind)
}

// link is a data connection of the session driven with raw syscalls (the
// sync connection, a bulk stream), re-established alone when it breaks.
// One request at a time holds mu.
type link struct {
	kind uint8
	mu   sync.Mutex
	// pg is the connection now. It changes under mu; shutdown loads it
	// without mu (to wake the request holding mu).
	pg  atomic.Pointer[rawconn.Conn]
	id  uint32 // pg's id in the session (the HELLO reply's; mu)
	bad error  // why the connection broke; nil while it serves (mu)
}

// shutdown wakes a request blocked on the link's connection.
func (l *link) shutdown() {
	if pg := l.pg.Load(); pg != nil {
		pg.Shutdown()
	}
}

// close ends the link for good (the session closes).
func (l *link) close() {
	l.shutdown()
	l.mu.Lock()
	if pg := l.pg.Load(); pg != nil {
		pg.Close()
	}
	if l.bad == nil {
		l.bad = protocol.ErrClosed
	}
	l.mu.Unlock()
}

// ready readies the link for a request (mu held): a connection that broke
// under an earlier request (its timeout, its context, a malformed reply)
// is re-established first, unless the session ended.
func (l *link) ready(ctx context.Context, c *Client) error {
	if l.bad == nil {
		return nil
	}
	if err := c.err(); err != nil {
		return err
	}
	if !broken(l.bad) {
		return l.bad // a refusal (GONE): it stands
	}
	return l.rejoin(ctx, c, fmt.Errorf("%w: the %s connection broke earlier", protocol.ErrDonorLost, kindName(l.kind)))
}

// broken reports whether err, which ended a request, left its connection
// to be re-established: the connection broke or timed out (ErrDonorLost),
// or a reply on it was malformed (ErrBadFrame: a wrong sequence number
// or opcode, a bad length, an unknown opcode; what follows on the stream
// cannot be trusted). Not a refusal the donor answered (GONE), which
// ends the session.
func broken(err error) bool {
	return errors.Is(err, protocol.ErrDonorLost) || errors.Is(err, protocol.ErrBadFrame)
}

// broke records err, which ended a request on the link (mu held), and
// shuts the connection down; err is returned wrapped with ctx's error if
// ctx ended, and a malformed reply's naming the connection.
func (l *link) broke(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		err = fmt.Errorf("%w: %w", protocol.ErrDonorLost, ctx.Err())
	case errors.Is(err, protocol.ErrBadFrame):
		err = fmt.Errorf("%w (a reply on the %s connection; the request's effect is unknown, and the connection is replaced)",
			err, kindName(l.kind))
	}
	l.bad = err
	l.pg.Load().Shutdown()
	return err
}

// recover decides, after broke, whether the request is sent again (see
// above): only if the donor ended the connection, ctx lives and the
// request has rejoined fewer than maxRejoins times (*tries), and the
// connection could be re-established. Otherwise it returns the error the
// request fails with, once the broken connection is replaced (settle).
func (l *link) recover(ctx context.Context, c *Client, err error, tries *int) (bool, error) {
	if !connEnded(err) || ctx.Err() != nil || *tries >= maxRejoins {
		return false, l.settle(ctx, c, err)
	}
	*tries++
	if rerr := l.rejoin(ctx, c, err); rerr != nil {
		c.unsettled(l.kind, rerr)
		return false, rerr
	}
	return true, nil
}

// settle re-establishes the link's connection (mu held), which broke
// under a request that fails with err, before the failure is returned:
// the new connection names the broken one, so the donor ends it and
// answers once nothing more of it can land. A WRITE given up — its
// payload late on its way, or held by a move's pause — then never lands
// after a request the caller issues once it has the failure, on this
// channel or any other of the session (docs/memory-protocol.md,
// "Sequence numbers"). It costs a failed request one HELLO round trip;
// requests that succeed pay nothing. A connection that cannot be
// re-established leaves the session lost (unsettled). A malformed reply
// is settled so too: the replies after it cannot be read, and the
// requests behind it (a bulk stream's window) may still land. A refusal
// (GONE) is not settled: the donor answered the request, and ends the
// session.
func (l *link) settle(ctx context.Context, c *Client, err error) error {
	if l.bad == nil || !broken(l.bad) || c.err() != nil {
		return err
	}
	// The caller's context may have ended (that is why the request
	// failed); the HELLO is bounded by Options.Timeout. (A cancellation
	// that ends the request for another reason may shut the new
	// connection down as it comes, from the request's AfterFunc: the
	// next request finds it ended and re-establishes it, recover.)
	if rerr := l.rejoin(context.WithoutCancel(ctx), c, l.bad); rerr != nil {
		c.unsettled(l.kind, rerr)
	}
	return err
}

// unsettled ends the session after a data connection of kind whose
// requests failed could not be ended at the donor (err: why): what was
// in flight on it might still land after a later request, so no later
// request goes out on the session (ErrDonorLost; a Following opens the
// region's session again). Nothing if the session ended already.
func (c *Client) unsettled(kind uint8, err error) {
	if c.err() != nil {
		return
	}
	c.lost(fmt.Errorf("%w: the %s connection of a failed request could not be ended at the donor: %v",
		protocol.ErrDonorLost, kindName(kind), err))
}

// rejoin re-establishes the link's connection as a new connection of the
// session (mu held); cause is why, returned (with what failed) if it
// cannot be.
func (l *link) rejoin(ctx context.Context, c *Client, cause error) error {
	if err := c.err(); err != nil {
		return err
	}
	// The new connection names the old one: the donor ends it, and
	// answers once nothing more of it can land (see above).
	pg, id, err := c.newRaw(ctx, l.kind, l.id)
	if err != nil {
		return fmt.Errorf("%w (re-establishing the %s connection: %v)", cause, kindName(l.kind), err)
	}
	if old := l.pg.Swap(pg); old != nil {
		old.Close()
	}
	l.id = id
	l.bad = nil
	c.rejoins.Add(1)
	if c.closed.Load() {
		// Close ran meanwhile and may have shut the old connection
		// down: the request fails on this one and finds the session
		// closed.
		pg.Shutdown()
	}
	return nil
}
