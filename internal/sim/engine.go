package sim

// Time is virtual time in seconds since the start of a simulation.
type Time = float64

// event is one entry of the calendar. Events at the same time run in the order
// they were scheduled (seq), which keeps runs deterministic.
type event struct {
	at  Time
	seq uint64
	fn  func()
}

// Engine is a discrete-event engine: a virtual clock and a calendar of events
// kept in a 4-ary min-heap ordered by (time, scheduling order). The zero value
// is an empty calendar at time 0.
type Engine struct {
	now    Time
	seq    uint64
	heap   []event
	events uint64
	stop   bool
}

// Now reports the virtual time.
func (e *Engine) Now() Time { return e.now }

// Events reports how many events have run.
func (e *Engine) Events() uint64 { return e.events }

// Pending reports how many events are scheduled.
func (e *Engine) Pending() int { return len(e.heap) }

// At schedules fn at virtual time t; a time in the past runs at Now.
func (e *Engine) At(t Time, fn func()) {
	if t < e.now {
		t = e.now
	}
	e.seq++
	e.heap = append(e.heap, event{at: t, seq: e.seq, fn: fn})
	e.up(len(e.heap) - 1)
}

// After schedules fn d seconds after Now.
func (e *Engine) After(d Time, fn func()) { e.At(e.now+d, fn) }

// Stop makes Run return after the current event.
func (e *Engine) Stop() { e.stop = true }

// Step runs the earliest event and reports whether there was one.
func (e *Engine) Step() bool {
	if len(e.heap) == 0 {
		return false
	}
	ev := e.heap[0]
	last := len(e.heap) - 1
	e.heap[0] = e.heap[last]
	e.heap[last] = event{}
	e.heap = e.heap[:last]
	if last > 0 {
		e.down(0)
	}
	e.now = ev.at
	e.events++
	ev.fn()
	return true
}

// Run runs events until the calendar is empty, Stop is called, or the next
// event is later than until (until <= 0 means no limit). It returns Now.
func (e *Engine) Run(until Time) Time {
	e.stop = false
	for len(e.heap) > 0 && !e.stop {
		if until > 0 && e.heap[0].at > until {
			e.now = until
			break
		}
		e.Step()
	}
	return e.now
}

func less(a, b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (e *Engine) up(i int) {
	h := e.heap
	x := h[i]
	for i > 0 {
		p := (i - 1) / 4
		if !less(&x, &h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
}

func (e *Engine) down(i int) {
	h := e.heap
	n := len(h)
	x := h[i]
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		end := c + 4
		if end > n {
			end = n
		}
		for j := c + 1; j < end; j++ {
			if less(&h[j], &h[m]) {
				m = j
			}
		}
		if !less(&h[m], &x) {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = x
}
