package placement

// How loaded links and devices are, as the candidates and evaluation
// stages of Index.Place see them.

import (
	"math"

	"github.com/rialto-project/rialto/internal/fabric"
)

// routeUtil is pathUtil(route(b, a), 0) with t the tree from b's anchor:
// the worst utilisation over b's leaf link, the core path between the
// anchors (computed once per anchor per candidates call) and a's leaf link.
// The worst of a set does not depend on the order it is taken in.
func (x *Index) routeUtil(t *fabric.Tree, b, a int32) float64 {
	if a == b || x.anchor[a] == b || x.anchor[b] == a {
		x.utilPath = x.route(x.utilPath[:0], b, a)
		return x.pathUtil(x.utilPath, 0)
	}
	aa := x.anchor[a]
	worst := 0.0
	if x.uStamp[aa] == x.uEpoch {
		worst = x.uVal[aa]
	} else {
		path := x.utilPath[:0]
		for _, cl := range t.PathTo(int(x.coreOf[aa])) {
			path = append(path, x.coreLink[cl])
		}
		x.utilPath = path
		worst = x.pathUtil(path, 0)
		x.uStamp[aa], x.uVal[aa] = x.uEpoch, worst
	}
	for _, li := range [2]int32{x.leafLink[b], x.leafLink[a]} {
		if li < 0 {
			continue
		}
		l := &x.links[li]
		if l.Bandwidth <= 0 {
			continue
		}
		if u := (l.Load + x.res[len(x.devs)+int(li)].load) / l.Bandwidth; u > worst {
			worst = u
		}
	}
	return worst
}

// pathUtil is the worst utilisation on a path with extra added to each link.
func (x *Index) pathUtil(path []int32, extra float64) float64 {
	worst := 0.0
	for _, li := range path {
		l := &x.links[li]
		if l.Bandwidth <= 0 {
			continue
		}
		u := (l.Load + x.res[len(x.devs)+int(li)].load + extra) / l.Bandwidth
		if u > worst {
			worst = u
		}
	}
	return worst
}

// devUtil is device di's demand over its delivered bandwidth once a new
// stream of demand add joins it.
func (x *Index) devUtil(di int32, add float64) float64 {
	ds := &x.devs[di]
	c := x.devCap(int(di), len(ds.leases)+1)
	if math.IsInf(c, 1) || c <= 0 {
		return 0
	}
	sum := 0.0
	if !math.IsInf(add, 1) {
		sum += add
	} else {
		sum += c
	}
	for _, li := range ds.leases {
		ls := &x.leases[li]
		coef := 0.0
		for _, u := range ls.uses {
			if u.Resource == int(di) {
				coef = u.Coef
			}
		}
		d := demandOf(ls.l.Demand)
		if math.IsInf(d, 1) {
			d = ls.rate / math.Max(coef, 1e-12)
			if math.IsInf(d, 1) {
				d = c
			}
		}
		sum += coef * d
	}
	return sum / c
}

// loadedCap is what link load counts of resource r: a link's bandwidth and
// background load, or a lent network interface's rate (a nic device is
// the lender's link to the network beyond it); ok is false for a link of
// unknown bandwidth and for other devices.
func (x *Index) loadedCap(r int) (capa, base float64, ok bool) {
	if r < len(x.devs) {
		ds := &x.devs[r]
		if ds.dev.Kind != KindNIC {
			return 0, 0, false
		}
		c := x.devCap(r, len(ds.leases)+1)
		return c, 0, c > 0 && !math.IsInf(c, 1)
	}
	l := &x.links[r-len(x.devs)]
	return l.Bandwidth, l.Load, l.Bandwidth > 0
}

// uplinkUtil is a nic device's current utilisation (0 for other kinds):
// the lent interface counts as a link on the lease's path.
func (x *Index) uplinkUtil(di int32) float64 {
	capa, _, ok := x.loadedCap(int(di))
	if !ok {
		return 0
	}
	return x.res[di].load / capa
}
