package nbd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/dirty"
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
// Without a move an export pays two atomic additions per write for this
// (the count of writes that started without seeing a move, which
// TrackWrites waits for), nothing per read.

// errRetired refuses the requests of a retired export.
var errRetired = errors.New("nbd: export retired")

// exportMove is an export's move state (export.mv), from the first
// TrackWrites, PauseWrites or Retire until EndMove.
type exportMove struct {
	dirty atomic.Pointer[dirty.Map]

	mu      sync.Mutex
	paused  bool
	retired bool
	active  int           // writes executing under the gate
	waiting int           // writes held by a pause
	wake    chan struct{} // closed and replaced at every change of the above
}

func newExportMove() *exportMove { return &exportMove{wake: make(chan struct{})} }

// changedLocked wakes the waiters; m.mu is held.
func (m *exportMove) changedLocked() {
	close(m.wake)
	m.wake = make(chan struct{})
}

// enter admits a write: it waits while writes are paused, and refuses it
// once the export is retired or ctx (the connection) ends.
func (m *exportMove) enter(ctx context.Context) error {
	m.mu.Lock()
	for m.paused && !m.retired {
		ch := m.wake
		m.waiting++
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			m.mu.Lock()
			m.waiting--
			m.mu.Unlock()
			return ctx.Err()
		}
		m.mu.Lock()
		m.waiting--
	}
	if m.retired {
		m.mu.Unlock()
		return errRetired
	}
	m.active++
	m.mu.Unlock()
	return nil
}

// leave ends a write admitted by enter, marking [off, off+n) dirty first.
func (m *exportMove) leave(off, n int64) {
	if d := m.dirty.Load(); d != nil {
		d.Mark(off, n)
	}
	m.mu.Lock()
	m.active--
	if m.active == 0 {
		m.changedLocked()
	}
	m.mu.Unlock()
}

func (m *exportMove) isRetired() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.retired
}

// isWrite reports whether a command changes the export.
func isWrite(typ uint16) bool {
	return typ == CmdWrite || typ == CmdTrim || typ == CmdWriteZeroes
}

// beginWrite counts a write that starts; it returns the export's move
// state, or nil when there is none (then the caller calls endUntracked
// when the write has completed).
func (e *export) beginWrite() *exportMove {
	e.untracked.Add(1)
	mv := e.mv.Load()
	if mv != nil {
		e.untracked.Add(-1)
	}
	return mv
}

func (e *export) endUntracked() { e.untracked.Add(-1) }

// gate is conn.execute's hook: it returns ok=false (with o's ESHUTDOWN
// reply encoded) for a request the export's move refuses, and otherwise a
// function to call when the request has completed (nil for none).
func (c *conn) gate(ctx context.Context, o *op) (done func(), ok bool) {
	if !isWrite(o.req.Type) {
		if mv := c.e.mv.Load(); mv != nil && mv.isRetired() {
			o.errno = ESHUTDOWN
			c.encodeError(o)
			return nil, false
		}
		return nil, true
	}
	mv := c.e.beginWrite()
	if mv == nil {
		return c.e.endUntracked, true
	}
	if err := mv.enter(ctx); err != nil {
		o.errno = ESHUTDOWN
		c.encodeError(o)
		return nil, false
	}
	off, n := int64(o.req.Offset), int64(o.req.Length)
	return func() { mv.leave(off, n) }, true
}

// inline reports whether the reader may execute o itself: not a write
// while the export has a move state (it may be held, and reads must not
// wait behind it).
func (c *conn) inline(o *op) bool {
	return !isWrite(o.req.Type) || c.e.mv.Load() == nil
}

// spliceCounted is spliceWrite counted as an untracked write; while the
// export has a move state writes take the buffered path instead, through
// the gate (handled=false).
func (c *conn) spliceCounted(o *op) (handled bool, err error) {
	if c.e.beginWrite() != nil {
		return false, nil
	}
	defer c.e.endUntracked()
	return c.spliceWrite(o)
}

// move returns the move state of export name, creating it if needed.
func (s *Server) move(name string) (*export, *exportMove, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.exports[name]
	if !ok {
		return nil, nil, ErrExportNotFound
	}
	mv := e.mv.Load()
	if mv == nil {
		mv = newExportMove()
		e.mv.Store(mv)
	}
	return e, mv, nil
}

// waitUntracked waits until no write that started before e's move state
// was installed is still executing.
func waitUntracked(ctx context.Context, e *export) error {
	// Writes are short (one pwrite or fallocate) and nothing signals the
	// end of an untracked one: poll, backing off.
	wait := 50 * time.Microsecond
	for e.untracked.Load() != 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Millisecond)
	}
	return nil
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
	e, mv, err := s.move(name)
	if err != nil {
		return err
	}
	mv.dirty.Store(d)
	return waitUntracked(ctx, e)
}

// PauseWrites holds the writes to export name that have not started (they
// wait, their connections stay open) and returns once every write under
// way has completed and been marked. If ctx ends first, writes are
// resumed and ctx's error returned.
func (s *Server) PauseWrites(ctx context.Context, name string) error {
	e, mv, err := s.move(name)
	if err != nil {
		return err
	}
	mv.mu.Lock()
	mv.paused = true
	mv.changedLocked()
	mv.mu.Unlock()
	if err := waitUntracked(ctx, e); err != nil {
		s.ResumeWrites(name)
		return err
	}
	mv.mu.Lock()
	defer mv.mu.Unlock()
	for mv.active > 0 {
		ch := mv.wake
		mv.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			mv.mu.Lock()
			mv.paused = false
			mv.changedLocked()
			return ctx.Err()
		}
		mv.mu.Lock()
	}
	return nil
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
	mv := e.mv.Load()
	if mv == nil {
		return 0
	}
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return mv.waiting
}

// ResumeWrites lets the writes held by PauseWrites proceed.
func (s *Server) ResumeWrites(name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	s.mu.Unlock()
	if !ok {
		return ErrExportNotFound
	}
	if mv := e.mv.Load(); mv != nil {
		mv.mu.Lock()
		mv.paused = false
		mv.changedLocked()
		mv.mu.Unlock()
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
	mv := e.mv.Swap(nil)
	s.mu.Unlock()
	if mv != nil {
		mv.dirty.Store(nil)
		mv.mu.Lock()
		mv.paused = false
		mv.changedLocked()
		mv.mu.Unlock()
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
	mv := e.mv.Load()
	if mv == nil {
		mv = newExportMove()
		e.mv.Store(mv)
	}
	conns := make([]*conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	mv.mu.Lock()
	mv.retired = true
	mv.changedLocked()
	mv.mu.Unlock()
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
