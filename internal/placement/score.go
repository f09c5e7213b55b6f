package placement

// The ranking stage of Index.Place.

import "strings"

// less is the ranking order of results: fewest unmet requirements, the
// preferred mode, (with spread, the least slowdown,) fewest hops, lowest
// latency, least loaded links in 10% bands, the strategy's packing, least
// slowdown, least link load, and ties end on the option's name.
func (x *Index) less(a, b *result, strategy string) bool {
	if a.unmet != b.unmet {
		return a.unmet < b.unmet
	}
	if a.modeRank != b.modeRank {
		return a.modeRank < b.modeRank
	}
	if strategy == Spread && a.slowdown != b.slowdown {
		return a.slowdown < b.slowdown
	}
	if a.hops != b.hops {
		return a.hops < b.hops
	}
	if a.latency != b.latency {
		return a.latency < b.latency
	}
	if a.linkBand != b.linkBand {
		return a.linkBand < b.linkBand
	}
	if a.pack1 != b.pack1 {
		return a.pack1 < b.pack1
	}
	if a.pack2 != b.pack2 {
		return a.pack2 < b.pack2
	}
	if a.slowdown != b.slowdown {
		return a.slowdown < b.slowdown
	}
	if a.linkUtil != b.linkUtil {
		return a.linkUtil < b.linkUtil
	}
	return x.name(a) < x.name(b)
}

// name is the option's name ("shared node/device", "composed n/d+n/d"),
// built on first use: only ties, rejections and the explanation need it.
func (x *Index) name(res *result) string {
	if res.name != "" {
		return res.name
	}
	var nb strings.Builder
	n := len(res.opt.mode)
	for _, di := range res.opt.devs {
		n += 2 + len(x.devs[di].dev.Node) + len(x.devs[di].dev.ID)
	}
	nb.Grow(n)
	nb.WriteString(res.opt.mode)
	for i, di := range res.opt.devs {
		if i == 0 {
			nb.WriteByte(' ')
		} else {
			nb.WriteByte('+')
		}
		nb.WriteString(x.devs[di].dev.Node)
		nb.WriteByte('/')
		nb.WriteString(x.devs[di].dev.ID)
	}
	res.name = nb.String()
	return res.name
}

// rank is the ranking stage of Place: it appends to top (of capacity n)
// the best n results and returns it, best first, in the order a stable
// sort by less would give (the first of equals stays first): selection
// instead of sorting every option.
func (x *Index) rank(top []*result, results []result, strategy string) []*result {
	n := cap(top)
	for i := range results {
		c := &results[i]
		if len(top) == n && !x.less(c, top[len(top)-1], strategy) {
			continue
		}
		j := len(top)
		if j < n {
			top = append(top, nil)
		} else {
			j--
		}
		for j > 0 && x.less(c, top[j-1], strategy) {
			top[j] = top[j-1]
			j--
		}
		top[j] = c
	}
	return top
}
