package clock

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// got returns what ch holds now, or the zero time.
func got(ch <-chan time.Time) time.Time {
	select {
	case v := <-ch:
		return v
	default:
		return time.Time{}
	}
}

func TestFakeTimers(t *testing.T) {
	type step struct {
		advance time.Duration
		fired   []string // timers that fire during this advance, in order
	}
	for _, c := range []struct {
		name   string
		timers map[string]time.Duration
		stop   []string // stopped before any advance
		steps  []step
	}{
		{"in time order", map[string]time.Duration{"b": 2 * time.Second, "a": time.Second, "c": 3 * time.Second},
			nil, []step{{500 * time.Millisecond, nil}, {500 * time.Millisecond, []string{"a"}}, {5 * time.Second, []string{"b", "c"}}, {time.Hour, nil}}},
		{"stopped never fires", map[string]time.Duration{"a": time.Second, "b": time.Second},
			[]string{"a"}, []step{{time.Second, []string{"b"}}}},
		{"negative advance is none", map[string]time.Duration{"a": time.Nanosecond},
			nil, []step{{-time.Hour, nil}, {time.Nanosecond, []string{"a"}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := NewFake(t0)
			var mu sync.Mutex
			var fired []string
			timers := map[string]Timer{}
			for name, d := range c.timers {
				timers[name] = f.AfterFunc(d, func() {
					mu.Lock()
					fired = append(fired, name)
					mu.Unlock()
				})
			}
			for _, name := range c.stop {
				if !timers[name].Stop() {
					t.Errorf("Stop(%s) = false on an armed timer", name)
				}
				if timers[name].Stop() {
					t.Errorf("second Stop(%s) = true", name)
				}
			}
			for i, s := range c.steps {
				fired = nil
				f.Advance(s.advance)
				if !slices.Equal(fired, s.fired) {
					t.Errorf("step %d (advance %v): fired %v, want %v", i, s.advance, fired, s.fired)
				}
			}
		})
	}
}

func TestFakeTimerChannel(t *testing.T) {
	f := NewFake(t0)
	tm := f.NewTimer(time.Second)
	f.Advance(999 * time.Millisecond)
	if v := got(tm.C()); !v.IsZero() {
		t.Fatalf("fired early at %v", v)
	}
	f.Advance(10 * time.Millisecond)
	if v := got(tm.C()); !v.Equal(t0.Add(time.Second)) {
		t.Fatalf("fired at %v, want the timer's time %v", v, t0.Add(time.Second))
	}
	if !f.Now().Equal(t0.Add(1009 * time.Millisecond)) {
		t.Fatalf("Now %v after advancing 1009ms", f.Now())
	}
	if tm.Stop() {
		t.Error("Stop after firing = true")
	}
	// Reset after firing re-arms; a fired value not received is dropped.
	if tm.Reset(time.Second) {
		t.Error("Reset of a fired timer = true")
	}
	f.Advance(time.Second)
	if tm.Reset(time.Second) {
		t.Error("Reset of a fired timer = true")
	}
	if v := got(tm.C()); !v.IsZero() {
		t.Fatalf("stale time %v received after Reset", v)
	}
	if !tm.Reset(2 * time.Second) {
		t.Error("Reset of an armed timer = false")
	}
	f.Advance(time.Second)
	if v := got(tm.C()); !v.IsZero() {
		t.Fatal("Reset did not push the timer back")
	}
	f.Advance(time.Second)
	if v := got(tm.C()); v.IsZero() {
		t.Fatal("reset timer did not fire")
	}
	// A timer of no duration fires at once.
	if v := got(f.NewTimer(0).C()); !v.Equal(f.Now()) {
		t.Fatalf("NewTimer(0) sent %v", v)
	}
	if f.Waiters() != 0 {
		t.Fatalf("%d waiters left", f.Waiters())
	}
}

func TestFakeTicker(t *testing.T) {
	f := NewFake(t0)
	tk := f.NewTicker(time.Second)
	f.Advance(time.Second)
	if v := got(tk.C()); !v.Equal(t0.Add(time.Second)) {
		t.Fatalf("first tick %v", v)
	}
	// Ticks a reader misses are dropped, as with time.Ticker.
	f.Advance(10 * time.Second)
	if v := got(tk.C()); !v.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("kept tick %v, want the first missed one", v)
	}
	if v := got(tk.C()); !v.IsZero() {
		t.Fatalf("second tick %v buffered", v)
	}
	tk.Reset(time.Minute)
	f.Advance(59 * time.Second)
	if v := got(tk.C()); !v.IsZero() {
		t.Fatal("tick before the reset period")
	}
	f.Advance(time.Second)
	if v := got(tk.C()); v.IsZero() {
		t.Fatal("no tick after the reset period")
	}
	tk.Stop()
	f.Advance(time.Hour)
	if v := got(tk.C()); !v.IsZero() {
		t.Fatal("tick after Stop")
	}
	defer func() {
		if recover() == nil {
			t.Error("NewTicker(0) did not panic")
		}
	}()
	f.NewTicker(0)
}

// An AfterFunc that arms another timer due within the same Advance sees it
// fire in that Advance, at its own time.
func TestFakeChainedAfterFunc(t *testing.T) {
	f := NewFake(t0)
	var at []time.Time
	var arm func()
	arm = func() {
		at = append(at, f.Now())
		if len(at) < 3 {
			f.AfterFunc(time.Second, arm)
		}
	}
	f.AfterFunc(time.Second, arm)
	f.Advance(10 * time.Second)
	want := []time.Time{t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(3 * time.Second)}
	if !slices.EqualFunc(at, want, time.Time.Equal) {
		t.Fatalf("fired at %v, want %v", at, want)
	}
	if !f.Now().Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("Now %v", f.Now())
	}
}

// BlockUntil lets a test advance only once a goroutine waits on the clock,
// and the goroutine then sees exactly the advanced time.
func TestFakeBlockUntil(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := &Fake{} // the zero value works
	done := make(chan time.Duration)
	go func() {
		start := f.Now()
		tm := f.NewTimer(time.Minute)
		<-tm.C()
		done <- f.Since(start)
	}()
	if err := f.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if next, ok := f.Next(); !ok || !next.Equal(time.Time{}.Add(time.Minute)) {
		t.Fatalf("Next = %v, %v", next, ok)
	}
	f.Advance(time.Minute)
	if d := <-done; d != time.Minute {
		t.Fatalf("waited %v of fake time", d)
	}
	short, cancelShort := context.WithCancel(ctx)
	cancelShort()
	if err := f.BlockUntil(short, 1); err == nil {
		t.Fatal("BlockUntil with nothing armed and a done ctx returned nil")
	}
}

// Many goroutines arm, stop and reset timers while another advances: run
// with -race.
func TestFakeConcurrent(t *testing.T) {
	f := NewFake(t0)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := f.NewTicker(time.Millisecond)
			defer tk.Stop()
			for {
				tm := f.NewTimer(time.Millisecond)
				select {
				case <-stop:
					tm.Stop()
					return
				case <-tm.C():
				case <-tk.C():
					tm.Reset(time.Millisecond)
				}
				tm.Stop()
			}
		}()
	}
	for range 1000 {
		f.Advance(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if f.Waiters() != 0 {
		t.Fatalf("%d waiters left after every goroutine stopped its timers", f.Waiters())
	}
}

// The real clock's timers, tickers and AfterFuncs fire.
func TestReal(t *testing.T) {
	c := Or(nil)
	if _, ok := c.(Real); !ok {
		t.Fatalf("Or(nil) = %T", c)
	}
	if f := NewFake(t0); Or(f) != Clock(f) {
		t.Fatal("Or does not keep a clock")
	}
	start := c.Now()
	within := func(ch <-chan time.Time, what string) {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not fire", what)
		}
	}
	within(c.NewTimer(time.Millisecond).C(), "timer")
	tk := c.NewTicker(time.Millisecond)
	within(tk.C(), "ticker")
	tk.Reset(time.Millisecond)
	within(tk.C(), "reset ticker")
	tk.Stop()
	ch := make(chan time.Time, 1)
	c.AfterFunc(time.Millisecond, func() { ch <- time.Now() })
	within(ch, "AfterFunc")
	if c.Since(start) < time.Millisecond {
		t.Fatal("Since after a 1ms timer is under 1ms")
	}
	tm := c.NewTimer(time.Hour)
	if !tm.Reset(time.Millisecond) {
		t.Fatal("Reset of an armed timer = false")
	}
	within(tm.C(), "reset timer")
	if tm.Stop() {
		t.Fatal("Stop of a fired timer = true")
	}
}

// FakeNow's time moves only with Advance; its timers are real.
func TestFakeNow(t *testing.T) {
	c := NewFakeNow(t0)
	if !c.Now().Equal(t0) {
		t.Fatalf("Now %v", c.Now())
	}
	tm := c.NewTimer(time.Hour)
	c.Advance(2 * time.Hour)
	if v := got(tm.C()); !v.IsZero() || c.Since(t0) != 2*time.Hour {
		t.Fatalf("Advance fired a real timer (%v) or did not move the time (%v)", v, c.Since(t0))
	}
	tm.Stop()
	select {
	case <-c.NewTimer(time.Millisecond).C():
	case <-time.After(30 * time.Second):
		t.Fatal("a real timer of FakeNow did not fire")
	}
	tk := c.NewTicker(time.Millisecond)
	defer tk.Stop()
	<-tk.C()
	done := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(done) })
	<-done
}

// TimerAt and AfterFuncAt fire at their time on a Fake, however far the
// clock moved between the reading of the time and the arming; at once
// for a time that has passed. On the real clock they fire too.
func TestAt(t *testing.T) {
	f := NewFake(t0)
	at := t0.Add(time.Minute)
	f.Advance(30 * time.Second) // after the time was read: a relative timer would fire at t0+90s
	tm := TimerAt(f, at)
	ran := make(chan time.Time, 1)
	AfterFuncAt(f, at, func() { ran <- f.Now() })
	f.Advance(30*time.Second - time.Nanosecond)
	if v := got(tm.C()); !v.IsZero() {
		t.Fatalf("fired early at %v", v)
	}
	f.Advance(time.Nanosecond)
	if v := got(tm.C()); !v.Equal(at) {
		t.Fatalf("fired at %v, want %v", v, at)
	}
	select {
	case v := <-ran:
		if !v.Equal(at) {
			t.Fatalf("AfterFuncAt ran at %v, want %v", v, at)
		}
	default:
		t.Fatal("AfterFuncAt did not run at its time")
	}
	if v := got(TimerAt(f, t0).C()); !v.Equal(f.Now()) {
		t.Fatalf("a timer for a past time sent %v", v)
	}
	done := make(chan struct{})
	AfterFuncAt(f, t0, func() { close(done) })
	<-done
	if f.Waiters() != 0 {
		t.Fatalf("%d waiters left", f.Waiters())
	}
	c := Or(nil)
	select {
	case <-TimerAt(c, c.Now().Add(time.Millisecond)).C():
	case <-time.After(30 * time.Second):
		t.Fatal("a real TimerAt did not fire")
	}
	fired := make(chan struct{})
	AfterFuncAt(c, c.Now(), func() { close(fired) })
	<-fired
}
