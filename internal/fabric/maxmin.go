package fabric

import (
	"math"
	"slices"
)

// Use says that a flow consumes Coef units of a resource (a link, a device)
// per unit of its rate. A composed lease striped over k devices uses each of
// them with Coef 1/k.
type Use struct {
	Resource int
	Coef     float64
}

// Flow is a demand on a set of resources. Demand is the most the flow wants
// in bytes/s (0 or +Inf: as much as it can get). Weight scales its share in
// the progressive filling (0 means 1).
type Flow struct {
	Demand float64
	Weight float64
	Uses   []Use
}

// MaxMin returns the weighted max-min fair rates of flows over resources
// with the given capacities (+Inf for unlimited). It is the allocation
// progressive filling reaches: every flow's rate grows in proportion to its
// weight until the flow meets its demand or one of its resources is full.
// A flow with no finite constraint gets +Inf. It allocates; use a Solver in
// loops.
func MaxMin(capacity []float64, flows []Flow) []float64 {
	var s Solver
	return s.Solve(capacity, flows, nil)
}

// Solver computes max-min fair rates, reusing its scratch space between
// calls. The zero value is ready to use; it is not safe for concurrent use.
type Solver struct {
	load, slope []float64
	version     []int32
	full        []bool
	frozen      []bool
	order       []int32
	start, adj  []int32 // resource -> flows (CSR)
	h           resHeap
	initial     bool
}

// Solve is MaxMin writing into rates (grown as needed) and returning it.
func (s *Solver) Solve(capacity []float64, flows []Flow, rates []float64) []float64 {
	nr, nf := len(capacity), len(flows)
	if cap(rates) < nf {
		rates = make([]float64, nf)
	}
	rates = rates[:nf]
	s.load = grow(s.load, nr)
	s.slope = grow(s.slope, nr)
	s.version = growI(s.version, nr)
	s.full = growB(s.full, nr)
	s.frozen = growB(s.frozen, nf)
	s.start = growI(s.start, nr+1)
	// CSR adjacency resource -> flows.
	total := 0
	for i := range flows {
		for _, u := range flows[i].Uses {
			s.start[u.Resource+1]++
			total++
		}
	}
	for r := 0; r < nr; r++ {
		s.start[r+1] += s.start[r]
	}
	s.adj = growI(s.adj, total)
	fill := s.version // reuse as cursor, reset below
	for i := range flows {
		for _, u := range flows[i].Uses {
			r := u.Resource
			s.adj[s.start[r]+fill[r]] = int32(i)
			fill[r]++
		}
	}
	for r := range fill {
		fill[r] = 0
	}
	// Slopes and flow demand levels.
	s.order = s.order[:0]
	for i := range flows {
		f := &flows[i]
		w := weight(f)
		rates[i] = 0
		for _, u := range f.Uses {
			s.slope[u.Resource] += u.Coef * w
		}
		s.order = append(s.order, int32(i))
	}
	slices.SortFunc(s.order, func(a, b int32) int {
		la, lb := demandLevel(&flows[a]), demandLevel(&flows[b])
		switch {
		case la < lb:
			return -1
		case la > lb:
			return 1
		}
		return int(a) - int(b)
	})
	s.h.items = s.h.items[:0]
	s.initial = true
	for r := 0; r < nr; r++ {
		s.push(capacity, r)
	}
	s.initial = false
	s.h.init()
	freeze := func(i int, level float64) {
		if s.frozen[i] {
			return
		}
		s.frozen[i] = true
		f := &flows[i]
		w := weight(f)
		rate := w * level
		if d := f.Demand; d > 0 && rate > d {
			rate = d
		}
		rates[i] = rate
		for _, u := range f.Uses {
			r := u.Resource
			s.load[r] += u.Coef * rate
			s.slope[r] -= u.Coef * w
			if !s.full[r] {
				s.version[r]++
				s.push(capacity, r)
			}
		}
	}
	next := 0
	for {
		for next < nf && s.frozen[s.order[next]] {
			next++
		}
		if next == nf {
			break
		}
		fl := demandLevel(&flows[s.order[next]])
		// Pop stale heap entries.
		for len(s.h.items) > 0 {
			top := s.h.items[0]
			if s.full[top.r] || top.ver != s.version[top.r] {
				s.h.pop()
				continue
			}
			break
		}
		if len(s.h.items) > 0 && s.h.items[0].level < fl {
			top := s.h.pop()
			r := int(top.r)
			s.full[r] = true
			for _, fi := range s.adj[s.start[r]:s.start[r+1]] {
				freeze(int(fi), top.level)
			}
			continue
		}
		if math.IsInf(fl, 1) {
			// No resource saturates and no demand remains: unconstrained.
			for ; next < nf; next++ {
				i := s.order[next]
				if !s.frozen[i] {
					s.frozen[i] = true
					rates[i] = math.Inf(1)
				}
			}
			break
		}
		freeze(int(s.order[next]), fl)
	}
	// Reset scratch for the next call.
	for r := 0; r < nr; r++ {
		s.load[r], s.slope[r], s.version[r], s.full[r] = 0, 0, 0, false
		s.start[r+1] = 0
	}
	s.start[0] = 0
	for i := range s.frozen {
		s.frozen[i] = false
	}
	return rates
}

func (s *Solver) push(capacity []float64, r int) {
	sl := s.slope[r]
	if sl <= 1e-12 {
		return
	}
	c := capacity[r]
	if math.IsInf(c, 1) {
		return
	}
	level := (c - s.load[r]) / sl
	if level < 0 {
		level = 0
	}
	s.h.items = append(s.h.items, resItem{level: level, r: int32(r), ver: s.version[r]})
	if !s.initial {
		s.h.up(len(s.h.items) - 1)
	}
}

func weight(f *Flow) float64 {
	if f.Weight > 0 {
		return f.Weight
	}
	return 1
}

func demandLevel(f *Flow) float64 {
	if f.Demand <= 0 || math.IsInf(f.Demand, 1) {
		return math.Inf(1)
	}
	return f.Demand / weight(f)
}

type resItem struct {
	level float64
	r     int32
	ver   int32
}

// resHeap is a binary min-heap of resource events by level, then resource.
type resHeap struct{ items []resItem }

func (h *resHeap) less(i, j int) bool {
	a, b := &h.items[i], &h.items[j]
	if a.level != b.level {
		return a.level < b.level
	}
	return a.r < b.r
}

func (h *resHeap) init() {
	for i := len(h.items)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *resHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			break
		}
		h.items[i], h.items[j] = h.items[j], h.items[i]
		j = i
	}
}

func (h *resHeap) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		j := l
		if r := l + 1; r < n && h.less(r, l) {
			j = r
		}
		if !h.less(j, i) {
			return
		}
		h.items[i], h.items[j] = h.items[j], h.items[i]
		i = j
	}
}

func (h *resHeap) pop() resItem {
	top := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	h.items = h.items[:n]
	if n > 0 {
		h.down(0)
	}
	return top
}

func grow(b []float64, n int) []float64 {
	if cap(b) < n {
		return make([]float64, n)
	}
	return b[:n]
}

func growI(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

func growB(b []bool, n int) []bool {
	if cap(b) < n {
		return make([]bool, n)
	}
	return b[:n]
}
