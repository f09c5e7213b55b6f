package dirty

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// Why a bounded wait stopped a writer ([Writer.Stop]).
var (
	// ErrStalled: none of the payload of the writer's write under way
	// arrived for [Stall.Wait] (a withheld payload).
	ErrStalled = errors.New("dirty: no payload arrived for a write under way within the move's wait")
	// ErrSlow: the writer's write under way was still receiving its
	// payload when [Stall.Limit] ran out.
	ErrSlow = errors.New("dirty: a write under way was still receiving its payload at the move's limit")
)

// A Writer is one writer of a range — a connection of an NBD export, of
// a memory region's session — as a move's bounded wait sees it
// ([Stall]). Its methods are called from the wait's own timer, and must be
// safe for concurrent use with the writer's.
type Writer interface {
	// Writing reports whether the writer has a write under way that
	// the wait waits for — one that started untracked (Writes.Begin
	// returned nil) or, when tracked, one a gate admitted too — and a
	// count of the bytes it has received so far, which grows while that
	// write's payload arrives (it may count other bytes too, never
	// fewer).
	Writing(tracked bool) (busy bool, received int64)
	// Stop ends the writer (closes its connection) so that its write
	// under way fails and ends promptly; why is ErrStalled or ErrSlow.
	Stop(why error)
}

// Stall bounds a move's wait for the writes under way when a writer may
// stall one after it started: a write admitted after its header waits for
// its payload, which a client may withhold, or send slowly. The wait
// looks at the writers every Wait/4: a writer whose write under way
// received nothing for Wait is stopped (ErrStalled); one whose payload
// keeps arriving is waited for, up to Limit from the start of the wait,
// when every writer with a write still under way is stopped (ErrSlow).
// Only the writers of the writes under way are stopped, never the
// range's other writers. The zero Stall does not bound the wait.
type Stall struct {
	// Wait is how long a write under way may receive none of its
	// payload. Zero or less: no bound (the wait lasts until the writes
	// end or its context does).
	Wait time.Duration
	// Limit bounds the whole wait for writes whose payload keeps
	// arriving, however slowly. Zero or less: no limit.
	Limit time.Duration
	// Writers lists the range's writers now. Nil: no bound.
	Writers func() []Writer
	// Clock times Wait and Limit; nil: the real clock.
	Clock clock.Clock
}

// WritersIn returns a [Stall.Writers] for a range whose writers are the
// keys of *set, which mu guards (*set may be nil): each call lists them
// under mu.
func WritersIn[W interface {
	Writer
	comparable
}](mu sync.Locker, set *map[W]struct{}) func() []Writer {
	return func() []Writer {
		mu.Lock()
		defer mu.Unlock()
		ws := make([]Writer, 0, len(*set))
		for w := range *set {
			ws = append(ws, w)
		}
		return ws
	}
}

// checksPerWait is how many times per Stall.Wait the writers are looked
// at: a writer is stopped after Wait to Wait·(1+1/checksPerWait) without
// payload.
const checksPerWait = 4

// within runs settle (a wait for the writes under way, tracked ones too
// if tracked) while s's watch stops the writers that stall, and returns
// settle's error. No writer is stopped once it has returned.
func (s Stall) within(ctx context.Context, tracked bool, settle func(context.Context) error) error {
	if s.Wait <= 0 || s.Writers == nil {
		return settle(ctx)
	}
	w := &watch{s: s, tracked: tracked, clk: clock.Or(s.Clock)}
	w.start()
	defer w.end()
	return settle(ctx)
}

// watch is a Stall at work: a timer, re-armed after every look at the
// writers. The timer's function runs on a goroutine of its own (on the
// Fake clock, on the one that advances it); once end has returned it
// looks at nothing and arms nothing.
type watch struct {
	s       Stall
	tracked bool
	clk     clock.Clock

	mu    sync.Mutex
	done  bool
	t     clock.Timer
	began time.Time
	seen  map[Writer]progress // writers with a write under way
}

// progress is what the watch last saw of a writer.
type progress struct {
	received int64
	at       time.Time // when received was first seen at its value
	stopped  bool
}

func (w *watch) period() time.Duration {
	return max(w.s.Wait/checksPerWait, time.Microsecond)
}

func (w *watch) start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.began = w.clk.Now()
	w.look(w.began)
	w.t = w.clk.AfterFunc(w.period(), w.check)
}

func (w *watch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	w.look(w.clk.Now())
	w.t = w.clk.AfterFunc(w.period(), w.check)
}

func (w *watch) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	w.t.Stop()
}

// look records the progress of the writers with a write under way and
// stops those that stalled, or every one of them once the limit ran out;
// w.mu is held.
func (w *watch) look(now time.Time) {
	over := w.s.Limit > 0 && now.Sub(w.began) >= w.s.Limit
	seen := make(map[Writer]progress, len(w.seen))
	for _, wr := range w.s.Writers() {
		busy, n := wr.Writing(w.tracked)
		if !busy {
			continue
		}
		p, ok := w.seen[wr]
		if !ok || n != p.received {
			p.received, p.at = n, now
		}
		if !p.stopped {
			switch {
			case now.Sub(p.at) >= w.s.Wait:
				p.stopped = true
				wr.Stop(ErrStalled)
			case over:
				p.stopped = true
				wr.Stop(ErrSlow)
			}
		}
		seen[wr] = p
	}
	w.seen = seen
}
