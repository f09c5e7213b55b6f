package nic

import "time"

// flowIdle is how long a flow may be silent before it is forgotten.
const flowIdle = 30 * time.Second

// maxFlows bounds the flow table; past it, the least recently seen half is
// forgotten at the next sweep.
const maxFlows = 1 << 16

// flowTable pins flows to bond members: a new flow goes to the eligible
// member with the fewest flows for its weight (so even a few flows spread
// over every lender), and stays there while it is active and its member is
// up (its translated address is that member's). It is used by one
// goroutine only.
type flowTable struct {
	flows     map[uint32]*flowEntry
	load      []int
	lastSweep time.Time
}

type flowEntry struct {
	member int
	last   time.Time
}

func newFlowTable(members int) *flowTable {
	return &flowTable{flows: map[uint32]*flowEntry{}, load: make([]int, members)}
}

// pick returns the member (an index into eligible's members, given by
// idx) for flow h. weight(i) is member i's weight.
func (t *flowTable) pick(h uint32, eligible []int, weight func(int) float64, now time.Time) int {
	if now.Sub(t.lastSweep) > flowIdle/6 || len(t.flows) > maxFlows {
		t.sweep(now)
	}
	e := t.flows[h]
	if e != nil {
		for _, m := range eligible {
			if m == e.member {
				e.last = now
				return m
			}
		}
		t.load[e.member]-- // its member is gone or does not reach the destination
	}
	best, bestCost := eligible[0], 0.0
	for k, m := range eligible {
		cost := float64(t.load[m]+1) / weight(m)
		if k == 0 || cost < bestCost {
			best, bestCost = m, cost
		}
	}
	if e == nil {
		e = &flowEntry{}
		t.flows[h] = e
	}
	e.member, e.last = best, now
	t.load[best]++
	return best
}

func (t *flowTable) sweep(now time.Time) {
	t.lastSweep = now
	idle := flowIdle
	if len(t.flows) > maxFlows {
		idle = flowIdle / 10
	}
	for h, e := range t.flows {
		if now.Sub(e.last) > idle {
			t.load[e.member]--
			delete(t.flows, h)
		}
	}
}
