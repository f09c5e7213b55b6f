package nbd

import (
	"context"
	"fmt"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	"golang.org/x/sys/unix"
)

// Moving an export while it is served. A lender moving a lease's range to
// another lender (the agent's live migration) copies it in the background
// while the borrower keeps writing, so the server lets it
//
//   - record which parts of the export completed writes changed
//     ([Server.TrackWrites] with a [dirty.Map]): the copier re-copies them
//     in passes until few remain;
//   - hold the writes that have not started while the last of them is
//     copied ([Server.PauseWrites], [Server.ResumeWrites]);
//   - stop serving the export cleanly once the new copy is served
//     ([Server.Retire]): requests that started complete and are answered,
//     held ones and any read after that point are answered ESHUTDOWN
//     (which tells a client to disconnect: the NBD protocol's "server
//     shutting down"), and each connection is closed once every request
//     it read has its reply.
//
// "Writes" are the requests that change the export: WRITE, TRIM and
// WRITE_ZEROES. A request is marked in the dirty map after it completed,
// failed or not, so a copier that cleared the map while it ran sees it
// again in its next pass; PauseWrites returns only once every write under
// way has completed and been marked.
//
// A write that started before the move (spliced, or read or, over TLS,
// decrypted into a mapping: neither passes the gate) is under way from
// its header on, while its payload arrives, and a client may withhold the
// payload, or send it slowly: TrackWrites and PauseWrites wait for such
// a write while its payload arrives, up to [Server.MoveWaitLimit] (1 minute),
// and close its connection once none of its payload arrived for
// [Server.MoveWait] (5 s), or at that limit (the write fails, unanswered,
// and what is left of its payload never lands); they return once the
// writes have ended (dirty.Stall). Only such a write's connection is
// closed: the export's other connections are served on, their writes
// held by the pause as usual.
//
// While the export moves, every write's payload is read into a buffer of
// the server's (none is spliced nor served from the reader's buffer) and
// waits there while PauseWrites holds it: the writes held are ops, with
// their pooled payload buffers, parked at the gate in the connection's
// workers (and its queue to them). Each connection's payload budget (64
// MiB) bounded one connection, but not the export: a borrower's other
// connections (multi-conn, an attachment's redials) each held as much
// again. The bytes taken in are counted at the move's gate
// (dirty.Gate.Reserve) from the reader's read of the payload until the
// write has been executed (written, or refused) or dropped; past
// [Server.MovePending] (64 MiB) the readers wait before reading a
// payload, so the client's sends wait (its requests stay in its socket),
// and an acknowledged write is never dropped nor one refused for it. A
// connection whose reader waits so sees its reads behind the write wait
// too (its requests are read in order). Writes taken in before the move
// began are not counted (each connection's budget bounds them, and they
// end within TrackWrites' wait or are held with the others).
// [Server.MoveStats] reports the bytes pending and their peak.
//
// Without a move an export pays two atomic additions per write for this
// (the count of writes that started without seeing a move, which
// TrackWrites waits for), nothing per read. The gate is dirty.Writes and
// dirty.Gate, which the memory donor's moves use too.

// isWrite reports whether a command changes the export.
func isWrite(typ uint16) bool {
	return typ == CmdWrite || typ == CmdTrim || typ == CmdWriteZeroes
}

// gate is conn.execute's hook: it returns ok=false (with o's ESHUTDOWN
// reply encoded) for a request the export's move refuses. Otherwise the
// caller ends the request once it has completed: with g.Leave when g is
// not nil, with EndUntracked when untracked (a write without a move).
// Nothing here allocates: a closure per write cost the garbage collector
// at high queue depth.
func (c *conn) gate(ctx context.Context, o *op) (g *dirty.Gate, untracked, ok bool) {
	w := &c.e.writes
	if !isWrite(o.req.Type) {
		if g := w.Gate(); g != nil && g.Retired() {
			o.errno = ESHUTDOWN
			c.encodeError(o)
			return nil, false, false
		}
		return nil, false, true
	}
	g = w.Begin()
	if g == nil {
		return nil, true, true
	}
	if err := g.Enter(ctx); err != nil {
		o.errno = ESHUTDOWN
		c.encodeError(o)
		return nil, false, false
	}
	return g, false, true
}

// inline reports whether the reader may execute o itself: not a write
// while the export has a move state (it may be held, and reads must not
// wait behind it).
func (c *conn) inline(o *op) bool {
	return !isWrite(o.req.Type) || c.e.writes.Gate() == nil
}

// spliceCounted is spliceWrite counted as an untracked write whose
// payload the reader reads (c.paying); while the export has a move state
// writes take the buffered path instead, through the gate
// (handled=false).
func (c *conn) spliceCounted(o *op) (handled bool, err error) {
	if c.e.writes.Begin() != nil {
		return false, nil
	}
	defer c.e.writes.EndUntracked()
	c.paying.Store(true)
	defer c.paying.Store(false)
	return c.spliceWrite(o)
}

// move returns export name and its write gate, installing it if needed.
func (s *Server) move(name string) (*export, *dirty.Gate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.exports[name]
	if !ok {
		return nil, nil, ErrExportNotFound
	}
	return e, e.writes.Install(), nil
}

// TrackWrites makes the writes to export name that complete from now on
// mark d (nil stops marking). It returns once no write that could have
// missed d is still executing, so that everything written after it
// returns, or still under way then, is either in the copy a caller makes
// next or marked in d.
func (s *Server) TrackWrites(ctx context.Context, name string, d *dirty.Map) error {
	if d != nil {
		s.mu.Lock()
		e, ok := s.exports[name]
		s.mu.Unlock()
		if ok && d.Size() != e.size {
			return fmt.Errorf("%w: dirty map of %d bytes for an export of %d", ErrInvalidExport, d.Size(), e.size)
		}
	}
	e, g, err := s.move(name)
	if err != nil {
		return err
	}
	return e.writes.TrackWithin(ctx, g, d, s.stall(e))
}

// PauseWrites holds the writes to export name that have not started (they
// wait, their connections stay open) and returns once every write under
// way has completed and been marked (a write whose payload stalled ended
// with its connection: see TrackWrites). If ctx ends first, writes are
// resumed and ctx's error returned.
func (s *Server) PauseWrites(ctx context.Context, name string) error {
	e, g, err := s.move(name)
	if err != nil {
		return err
	}
	return e.writes.PauseWithin(ctx, g, s.stall(e))
}

// DefaultMoveWait is how long a write under way may receive none of its
// payload before TrackWrites and PauseWrites close its connection, when
// Server.MoveWait is zero.
const DefaultMoveWait = 5 * time.Second

// DefaultMoveWaitLimit is how long TrackWrites and PauseWrites wait at
// most for writes under way whose payload keeps arriving, when
// Server.MoveWaitLimit is zero: a 32 MiB write gets it across a link of
// 5 Mbit/s, and a client trickling its payload holds a move up no
// longer.
const DefaultMoveWaitLimit = time.Minute

func (s *Server) moveWait() time.Duration {
	if s.MoveWait > 0 {
		return s.MoveWait
	}
	return DefaultMoveWait
}

func (s *Server) moveWaitLimit() time.Duration {
	if s.MoveWaitLimit > 0 {
		return s.MoveWaitLimit
	}
	return DefaultMoveWaitLimit
}

// stall bounds a move's wait for e's writes under way: the connections
// whose write stalls are closed (conn.Stop), not the others.
func (s *Server) stall(e *export) dirty.Stall {
	return dirty.Stall{Wait: s.moveWait(), Limit: s.moveWaitLimit(), Clock: s.Clock,
		Writers: dirty.WritersIn(&s.mu, &e.conns)}
}

// Writing implements dirty.Writer for a move's bounded wait: the writes
// it may wait for and that can stall are those whose payload the reader
// reads after they started (spliced, or read or decrypted into a
// mapping), all
// untracked. received counts the bytes the reader took from the socket
// for them and those queued in the socket, not read yet: a spliced
// payload is read only once SO_RCVLOWAT bytes of it are there, and a
// payload that trickles in is arriving all the same.
func (c *conn) Writing(bool) (busy bool, received int64) {
	if !c.paying.Load() {
		return false, 0
	}
	return true, c.recv.Load() + c.queued()
}

// queued is how many bytes the socket holds, not read yet (SIOCINQ).
func (c *conn) queued() int64 {
	rc := c.sock
	if rc == nil {
		rc = c.rawc
	}
	if rc == nil {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	})
	return int64(n)
}

// Stop implements dirty.Writer: it closes c, whose write under way
// stalled (why), so that the reader's read of the socket fails and the
// write ends, unanswered; what is left of its payload is never read. The
// client's next connection is served (or its writes held) like any. It
// does not wait for the connection to end: the move waits for the write.
func (c *conn) Stop(why error) {
	c.s.logger().Warn("nbd: move: closing the connection of a write whose payload stalled",
		"export", NameTag(c.e.Name), "why", why, "wait", c.s.moveWait(), "limit", c.s.moveWaitLimit())
	c.cancel()
	c.nc.Close()
}

// HeldWrites reports how many writes to export name are held by
// PauseWrites (or a sealed move) right now: tests and metrics wait on it.
func (s *Server) HeldWrites(name string) int {
	s.mu.Lock()
	e, ok := s.exports[name]
	s.mu.Unlock()
	if !ok {
		return 0
	}
	if g := e.writes.Gate(); g != nil {
		return g.Waiting()
	}
	return 0
}

// ResumeWrites lets the writes held by PauseWrites proceed.
func (s *Server) ResumeWrites(name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	s.mu.Unlock()
	if !ok {
		return ErrExportNotFound
	}
	if g := e.writes.Gate(); g != nil {
		g.Resume()
	}
	return nil
}

// EndMove stops tracking export name's writes and resumes them: the
// export is served as if no move had started (a move given up).
func (s *Server) EndMove(name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	if !ok {
		s.mu.Unlock()
		return ErrExportNotFound
	}
	g := e.writes.Remove()
	s.mu.Unlock()
	if g != nil {
		g.End()
	}
	return nil
}

// Retire stops serving export name cleanly: it is unregistered (no new
// connection reaches it), writes held by PauseWrites and every request
// read from now on are answered ESHUTDOWN, requests under way complete
// and are answered, and each connection stops reading and is closed once
// every request it read has been answered. It returns when every
// connection has ended; if ctx ends first, the connections left are
// closed at once, as RemoveExport closes them. Like RemoveExport, once it
// returns no request of the export reaches the backend.
//
// ESHUTDOWN asks an NBD client to disconnect; Rialto's client reports it
// as [ErrShutdown] (which matches ErrClosed too), and the borrower's
// attachment redials the part where the control plane now says it is.
func (s *Server) Retire(ctx context.Context, name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	if !ok {
		s.mu.Unlock()
		return ErrExportNotFound
	}
	delete(s.exports, name)
	g := e.writes.Install()
	conns := e.connList()
	s.mu.Unlock()
	g.Retire()
	for _, c := range conns {
		if cr, ok := c.nc.(interface{ CloseRead() error }); ok {
			// The reader sees the end of the stream after the requests
			// already received; the replies still go out.
			cr.CloseRead()
		} else {
			c.cancel()
			c.nc.Close()
		}
	}
	var err error
	for _, c := range conns {
		select {
		case <-c.done:
		case <-ctx.Done():
			err = ctx.Err()
			c.cancel()
			c.nc.Close()
			<-c.done
		}
	}
	s.logger().Info("nbd: export retired", "export", NameTag(name), "connections", len(conns), "clean", err == nil)
	return err
}

// Connections reports how many connections export name has (0 for an
// unknown export).
func (s *Server) Connections(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.exports[name]; ok {
		return len(e.conns)
	}
	return 0
}

// DefaultMovePending is Server.MovePending's default: the bytes of writes
// a moving export may hold in memory, over all its connections.
const DefaultMovePending = 64 << 20

func (s *Server) movePending() int64 {
	switch {
	case s.MovePending > 0:
		return s.MovePending
	case s.MovePending < 0:
		return 0 // no bound
	}
	return DefaultMovePending
}

// reservePending counts o's payload, about to be read, at the export's
// move gate (if it moves), waiting while Server.MovePending bytes are
// pending there; an error (the connection ends) leaves nothing counted.
func (c *conn) reservePending(ctx context.Context, o *op) error {
	g := c.e.writes.Gate()
	if g == nil {
		return nil
	}
	n := int64(o.req.Length)
	limit := c.s.movePending()
	if st := g.Stats(); limit > 0 && st.Pending > 0 && st.Pending+n > limit {
		// About to wait: hand over the requests parsed and send the
		// replies held first, and let the workers watch for the
		// client's end meanwhile (abandon.go), as for the budget.
		if err := c.flushBatch(); err != nil {
			return err
		}
		c.blockBegin()
		defer c.blockEnd()
	}
	ok, err := g.Reserve(ctx, n, limit)
	if err != nil {
		return fmt.Errorf("nbd: waiting for the move's pending writes: %w", err)
	}
	if ok {
		o.pend = g
	}
	return nil
}

// unpend ends o's count at its move's gate, if it has one.
func (c *conn) unpend(o *op) {
	if o.pend != nil {
		o.pend.Unreserve(int64(o.req.Length))
		o.pend = nil
	}
}

// MoveStats reports the state of export name's move: the writes held, the
// payload bytes pending (Server.MovePending) and their peak since the
// move began, the connections waiting to take more in. ok is false when
// the export is unknown or does not move.
func (s *Server) MoveStats(name string) (st dirty.Stats, ok bool) {
	s.mu.Lock()
	e, found := s.exports[name]
	s.mu.Unlock()
	if !found {
		return dirty.Stats{}, false
	}
	g := e.writes.Gate()
	if g == nil {
		return dirty.Stats{}, false
	}
	return g.Stats(), true
}

// WaitMove waits until cond holds for export name's move (MoveStats), or
// ctx ends; it fails at once if the export is unknown or does not move.
// See dirty.Gate.WaitChange for when cond is looked at.
func (s *Server) WaitMove(ctx context.Context, name string, cond func(dirty.Stats) bool) error {
	s.mu.Lock()
	e, found := s.exports[name]
	s.mu.Unlock()
	if !found {
		return ErrExportNotFound
	}
	g := e.writes.Gate()
	if g == nil {
		return fmt.Errorf("nbd: export %s does not move", NameTag(name))
	}
	return g.WaitChange(ctx, cond)
}
