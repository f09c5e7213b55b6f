package sim

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/rialto-project/rialto/internal/fabric"
)

func TestEngineOrder(t *testing.T) {
	var e Engine
	var got []int
	e.At(2, func() { got = append(got, 3) })
	e.At(1, func() { got = append(got, 1) })
	e.At(1, func() {
		got = append(got, 2)
		e.After(0, func() { got = append(got, 21) })
	})
	e.At(5, func() { got = append(got, 5) })
	if end := e.Run(3); end != 3 {
		t.Fatalf("Run(3) = %v", end)
	}
	want := []int{1, 2, 21, 3}
	if len(got) != len(want) {
		t.Fatalf("got %v want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v want %v", got, want)
		}
	}
	e.Run(0)
	if got[len(got)-1] != 5 || e.Now() != 5 || e.Events() != 5 {
		t.Fatalf("got %v now %v events %d", got, e.Now(), e.Events())
	}
}

func TestEngineHeapRandom(t *testing.T) {
	var e Engine
	r := newRand(1)
	last := -1.0
	n := 0
	for i := 0; i < 10000; i++ {
		e.At(r.Float64()*100, func() {
			if e.Now() < last {
				t.Fatalf("time went back: %v < %v", e.Now(), last)
			}
			last = e.Now()
			n++
		})
	}
	e.Run(0)
	if n != 10000 {
		t.Fatalf("ran %d", n)
	}
}

func TestNetFlowsFinishInOrder(t *testing.T) {
	var e Engine
	n := NewNet(&e)
	link := &Resource{Name: "l", Capacity: 100}
	var done []Time
	// Two flows of 100 and 300 bytes share 100 B/s: the first ends at 2 s
	// (50 B/s each), then the second runs alone: 200 bytes left at 100 B/s.
	n.Start(100, []*Resource{link}, 0, func(*Flow) { done = append(done, e.Now()) })
	n.Start(300, []*Resource{link}, 0, func(*Flow) { done = append(done, e.Now()) })
	e.Run(0)
	if len(done) != 2 || math.Abs(done[0]-2) > 1e-9 || math.Abs(done[1]-4) > 1e-9 {
		t.Fatalf("done at %v, want [2 4]", done)
	}
	if math.Abs(link.Bytes-400) > 1e-6 || math.Abs(link.Busy-4) > 1e-9 {
		t.Fatalf("bytes %v busy %v", link.Bytes, link.Busy)
	}
}

func TestNetProfile(t *testing.T) {
	var e Engine
	n := NewNet(&e)
	dev := &Resource{Capacity: 100, Profile: Table{1, 0.5}}
	var done []Time
	for i := 0; i < 2; i++ {
		n.Start(50, []*Resource{dev}, 0, func(*Flow) { done = append(done, e.Now()) })
	}
	e.Run(0)
	// Two flows: 50 B/s delivered in total, 25 each: both end at 2 s.
	if len(done) != 2 || math.Abs(done[1]-2) > 1e-9 {
		t.Fatalf("done %v", done)
	}
}

func BenchmarkEngine(b *testing.B) {
	var e Engine
	r := newRand(1)
	// Keep ~10,000 events pending; every event schedules its successor.
	var fn func()
	fn = func() { e.After(r.Float64(), fn) }
	for i := 0; i < 10000; i++ {
		e.At(r.Float64(), fn)
	}
	b.ResetTimer()
	c0 := cpuSeconds()
	for i := 0; i < b.N; i++ {
		e.Step()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.N)/(cpuSeconds()-c0), "events/cpu-s")
}

func TestNetRatesFromFabricMaxMin(t *testing.T) {
	var e Engine
	n := NewNet(&e)
	wide := &Resource{Capacity: 10}
	narrow := &Resource{Capacity: 4}
	free := &Resource{} // unlimited
	a := n.Start(1e9, []*Resource{wide, narrow, free}, 0, nil)
	b := n.Start(1e9, []*Resource{wide}, 0, nil)
	c := n.Start(1e9, []*Resource{free}, 3, nil)
	e.Run(1)
	if math.Abs(a.Rate()-4) > 1e-9 || math.Abs(b.Rate()-6) > 1e-9 || math.Abs(c.Rate()-3) > 1e-9 {
		t.Fatalf("rates %v %v %v, want 4 6 3", a.Rate(), b.Rate(), c.Rate())
	}
}

// TestNetCoef: a flow that takes two bytes of a link per byte it moves
// (a header per packet, a tunnel's framing) gets half the link alone; with
// a plain flow beside it max-min equalises their rates, capacity/(2+1)
// each; the link counts the bytes both put on it.
func TestNetCoef(t *testing.T) {
	var e Engine
	n := NewNet(&e)
	link := &Resource{Capacity: 90}
	a := n.StartCoef(1e9, []*Resource{link}, []float64{2}, 0, nil)
	e.Run(1)
	if math.Abs(a.Rate()-45) > 1e-9 {
		t.Fatalf("alone: %v, want 45", a.Rate())
	}
	b := n.Start(1e9, []*Resource{link}, 0, nil)
	e.Run(2)
	if math.Abs(a.Rate()-30) > 1e-9 || math.Abs(b.Rate()-30) > 1e-9 {
		t.Fatalf("shared: %v %v, want 30 30", a.Rate(), b.Rate())
	}
	// 1 s alone at 45 (90 B/s of link) and 1 s at 30+30 (90 B/s), settled
	// when the flows leave.
	n.Cancel(a)
	n.Cancel(b)
	if math.Abs(link.Bytes-180) > 1e-6 {
		t.Fatalf("link bytes %v, want 180", link.Bytes)
	}
	defer func() {
		if recover() == nil {
			t.Error("coefficients of another length accepted")
		}
	}()
	n.StartCoef(1, []*Resource{link}, []float64{1, 2}, 0, nil)
}

// TestNetAllAtCap: solve's shortcut (every flow capped, every resource
// with room to spare at the caps) gives exactly the rates of fabric's
// max-min solver, and components that fill a resource, or have an uncapped
// flow, go to the solver. Random components of a few resources, coefficients
// and caps, half of them built to fit.
func TestNetAllAtCap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var short, full int
	for iter := 0; iter < 2000; iter++ {
		var e Engine
		n := NewNet(&e)
		var rs []*Resource
		for i := 0; i < 1+rng.IntN(5); i++ {
			c := 1 + 100*rng.Float64()
			if rng.IntN(6) == 0 {
				c = 0 // unlimited
			}
			rs = append(rs, &Resource{Capacity: c})
		}
		fit := iter%2 == 0
		var fs []*Flow
		for i := 0; i < 1+rng.IntN(8); i++ {
			var path []*Resource
			var coef []float64
			for _, r := range rs {
				if rng.IntN(2) == 0 {
					path = append(path, r)
					coef = append(coef, 0.5+rng.Float64())
				}
			}
			if len(path) == 0 {
				path, coef = rs[:1], []float64{1}
			}
			c := 1 + 40*rng.Float64()
			if fit {
				c = 0.01 + rng.Float64()
			}
			if rng.IntN(20) == 0 {
				c = 0 // uncapped
			}
			if rng.IntN(3) == 0 {
				coef = nil
			}
			fs = append(fs, &Flow{Path: path, Coef: coef, Cap: c})
		}
		n.solve(rs, fs)
		caps := make([]float64, len(rs))
		for i, r := range rs {
			caps[i] = r.Delivered()
		}
		ff := make([]fabric.Flow, len(fs))
		allCapped := true
		for i, f := range fs {
			ff[i].Demand = f.Cap
			allCapped = allCapped && f.Cap > 0
			for j, r := range f.Path {
				c := 1.0
				if f.Coef != nil {
					c = f.Coef[j]
				}
				ff[i].Uses = append(ff[i].Uses, fabric.Use{Resource: r.idx, Coef: c})
			}
		}
		want := fabric.MaxMin(caps, ff)
		atCap := allCapped
		for i, f := range fs {
			w := want[i]
			if math.IsInf(w, 1) {
				w = 0
			}
			if f.rate != w {
				t.Fatalf("iter %d: flow %d rate %v, solver %v", iter, i, f.rate, w)
			}
			atCap = atCap && f.rate == f.Cap
		}
		if atCap {
			short++
		} else {
			full++
		}
	}
	if short < 500 || full < 500 {
		t.Fatalf("%d components all at cap, %d not: the cases do not cover both paths", short, full)
	}
}
