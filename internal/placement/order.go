package placement

// The candidate order (cmpCand) and the selections that take the first k
// candidates in it without sorting them all.

import "math"

// cmpCand is the candidate order, a total order: nearest, lowest latency,
// least loaded links, the strategy's packing, then link utilisation, and
// ties end on device ID.
func (x *Index) cmpCand(a, b *cand) int {
	switch {
	case a.k1 != b.k1:
		if a.k1 < b.k1 {
			return -1
		}
		return 1
	case a.linkUtil != b.linkUtil:
		if a.linkUtil < b.linkUtil {
			return -1
		}
		return 1
	}
	return int(x.devRank[a.dev]) - int(x.devRank[b.dev])
}

// before is the candidate order (cmpCand), or with byLoad fewest leases
// first and then the candidate order.
func (x *Index) before(a, b *cand, byLoad bool) bool {
	if byLoad && a.nLeases != b.nLeases {
		return a.nLeases < b.nLeases
	}
	if a.k1 != b.k1 {
		return a.k1 < b.k1
	}
	return x.cmpCand(a, b) < 0
}

// topK appends to dst the positions in cands of the (at most) k first
// candidates in order (x.before) for which keep (nil: all) holds, in that
// order: what walking a sorted list and taking the first k matches gives.
func (x *Index) topK(dst []int32, cands []cand, k int, keep func(c *cand) bool, byLoad bool) []int32 {
	dst = dst[:0]
	if k <= 0 {
		return dst
	}
	for i := range cands {
		c := &cands[i]
		if keep != nil && !keep(c) {
			continue
		}
		if len(dst) == k && !x.before(c, &cands[dst[k-1]], byLoad) {
			continue
		}
		j := len(dst)
		if j < k {
			dst = append(dst, 0)
		} else {
			j = k - 1
		}
		for j > 0 && x.before(c, &cands[dst[j-1]], byLoad) {
			dst[j] = dst[j-1]
			j--
		}
		dst[j] = int32(i)
	}
	return dst
}

// firstK is topK(dst, cands, k, keep, false) using prefix, the first
// candidates in order, when it holds k matches (or all candidates).
func (x *Index) firstK(dst, prefix []int32, cands []cand, k int, keep func(c *cand) bool) []int32 {
	dst = dst[:0]
	for _, i := range prefix {
		if len(dst) == k {
			return dst
		}
		if keep == nil || keep(&cands[i]) {
			dst = append(dst, i)
		}
	}
	if len(dst) == k || len(prefix) == len(cands) {
		return dst
	}
	return x.topK(dst, cands, k, keep, false)
}

// candKey packs a candidate's ordering: fewest hops, lowest latency, link
// load in 10% bands, then the strategy's packing (binpack: most leases
// first; spread: fewest).
func candKey(c *cand, strategy string) uint64 {
	hops := min(uint64(c.dist.Hops), 255)
	lat := min(uint64(max(c.latency, 0)), 1<<35-1)
	b := min(uint64(max(band(c.linkUtil), 0)), 15)
	n := min(uint64(c.nLeases), 1<<16-1)
	if strategy != Spread {
		n = 1<<16 - 1 - n
	}
	return hops<<56 | lat<<20 | b<<16 | n
}

func band(u float64) int { return int(math.Floor(u * 10)) }
