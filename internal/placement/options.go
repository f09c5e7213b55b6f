package placement

import "slices"

// The options stage of Index.Place: the ways to place a request worth
// predicting, per mode.

// candPrefix is how many candidates Place orders up front (at least the
// six shared options and the widest composition).
const candPrefix = 8

// option is one way to place the request: a mode and the devices holding a
// part of partLen each (in candidate order).
type option struct {
	mode    string
	devs    []int32
	partLen int64
}

// optionSet collects options without duplicates.
type optionSet struct {
	x      *Index
	cands  []cand
	prefix []int32 // the first candidates in order: most options are found in it
	sel    []int32 // scratch
	list   []option
}

// add adds o unless the set holds it already, its devices sorted in
// candidate order.
func (s *optionSet) add(o option) {
	if len(o.devs) > 1 {
		slices.SortFunc(o.devs, func(a, b int32) int { return s.x.cmpCand(&s.cands[s.x.candPos[a]], &s.cands[s.x.candPos[b]]) })
	}
	for _, e := range s.list {
		if e.mode == o.mode && slices.Equal(e.devs, o.devs) {
			return
		}
	}
	s.list = append(s.list, o)
}

// options is the options stage of Place: the options worth predicting for
// each mode in scope. Each is what walking the candidates in order (or by
// load) and taking the first that fit gives; topK and firstK select them
// without sorting the candidates.
func (x *Index) options(q *req, sc *scope, cands []cand) []option {
	s := optionSet{x: x, cands: cands, sel: x.selBuf[:0]}
	s.prefix = x.topK(x.prefBuf[:0], cands, candPrefix, nil, false)
	x.prefBuf = s.prefix[:0]
	if sc.dedicate {
		x.dedicateOptions(&s, q)
	}
	// The MaxWidth least-loaded candidates, ties in candidate order.
	var byLoadBuf [MaxWidth]cand
	byLoad := byLoadBuf[:0]
	s.sel = x.topK(s.sel, cands, MaxWidth, nil, true)
	for _, i := range s.sel {
		byLoad = append(byLoad, cands[i])
	}
	if sc.share {
		x.shareOptions(&s, sc, byLoad)
	}
	if sc.compose {
		x.composeOptions(&s, q, sc, byLoad)
	}
	x.selBuf = s.sel[:0]
	return s.list
}

// dedicateOptions: the first two candidates that can be dedicated to q
// (whole, unused, of exactly q's size when q is Exact), each holding a
// part of its whole capacity. A whole-device request has only these.
func (x *Index) dedicateOptions(s *optionSet, q *req) {
	s.sel = x.firstK(s.sel, s.prefix, s.cands, 2, func(c *cand) bool {
		return x.dedicable(&x.devs[c.dev], q)
	})
	for _, i := range s.sel {
		c := &s.cands[i]
		s.add(option{mode: ModeDedicated, devs: []int32{c.dev}, partLen: x.devs[c.dev].dev.Capacity})
	}
}

// shareOptions: a part of sc.shareLen on each of the first six
// partitionable candidates and on the two least loaded (byLoad), where it
// fits.
func (x *Index) shareOptions(s *optionSet, sc *scope, byLoad []cand) {
	add := func(c *cand) {
		if ds := &x.devs[c.dev]; ds.free >= sc.shareLen && !ds.exclusive {
			s.add(option{mode: ModeShared, devs: []int32{c.dev}, partLen: sc.shareLen})
		}
	}
	s.sel = x.firstK(s.sel, s.prefix, s.cands, 6, x.partitionable)
	for _, i := range s.sel {
		add(&s.cands[i])
	}
	for i := 0; i < len(byLoad) && i < 2; i++ {
		add(&byLoad[i])
	}
}

// composeOptions: for each width in scope, the parts on the first
// candidates that fit them, and on the least loaded (byLoad) that do.
//
// A block volume's parts go to w different lenders whenever w lenders have
// room, so that their traffic shares no lender's link or disks; only with
// fewer lenders may one hold several parts. A bond of lent network
// interfaces (nic) always has its parts on w different lenders: its
// bandwidth adds over lenders, and losing one degrades it instead of
// breaking it. The lenders are picked from the best few candidates that
// could hold the smallest part. Accelerator slots keep to candidate
// order, which favours slots close together.
func (x *Index) composeOptions(s *optionSet, q *req, sc *scope, byLoad []cand) {
	var poolBuf [4 * MaxWidth]int32
	var pool []int32
	if q.Kind == KindBlock || q.Kind == KindNIC {
		least := sc.partLen(q.Size, sc.maxW)
		pool = x.topK(poolBuf[:0], s.cands, len(poolBuf), func(c *cand) bool {
			ds := &x.devs[c.dev]
			return ds.free >= least && !ds.exclusive
		}, false)
	}
	for w := sc.minW; w <= sc.maxW; w++ {
		pl := sc.partLen(q.Size, w)
		fits := func(c *cand) bool { ds := &x.devs[c.dev]; return ds.free >= pl && !ds.exclusive }
		if devs := x.distinctLenders(len(pool), func(k int) *cand { return &s.cands[pool[k]] }, w, fits); devs != nil {
			s.add(option{mode: ModeComposed, devs: devs, partLen: pl})
			if devs := x.distinctLenders(len(byLoad), func(k int) *cand { return &byLoad[k] }, w, fits); devs != nil {
				s.add(option{mode: ModeComposed, devs: devs, partLen: pl})
			}
			continue
		}
		if q.Kind == KindNIC {
			continue // fewer than w lenders have room: no bond of w
		}
		s.sel = x.firstK(s.sel, s.prefix, s.cands, w, fits)
		if len(s.sel) == w {
			devs := make([]int32, w)
			for k, i := range s.sel {
				devs[k] = s.cands[i].dev
			}
			s.add(option{mode: ModeComposed, devs: devs, partLen: pl})
		}
		var devs []int32
		for k := range byLoad {
			if fits(&byLoad[k]) {
				devs = append(devs, byLoad[k].dev)
				if len(devs) == w {
					break
				}
			}
		}
		if len(devs) == w {
			s.add(option{mode: ModeComposed, devs: devs, partLen: pl})
		}
	}
}

// distinctLenders returns w devices on w different nodes: of the n
// candidates at(0), at(1), ... (best first), the first that keep holds for
// on each node; nil when fewer than w nodes have one.
func (x *Index) distinctLenders(n int, at func(k int) *cand, w int, keep func(c *cand) bool) []int32 {
	var devs []int32
next:
	for k := range n {
		c := at(k)
		if !keep(c) {
			continue
		}
		node := x.devs[c.dev].dev.Node
		for _, d := range devs {
			if x.devs[d].dev.Node == node {
				continue next
			}
		}
		devs = append(devs, c.dev)
		if len(devs) == w {
			return devs
		}
	}
	return nil
}
