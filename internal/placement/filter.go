package placement

// The tests that rule a device in or out for a request: dedicable,
// partitionable, labels, affinity.

import (
	"fmt"
	"strings"
)

// wholeFree reports whether ds can be dedicated to a request of size n: an
// empty device (no lease at all) of capacity at least n.
func (x *Index) wholeFree(ds *devState, n int64) bool {
	return len(ds.leases) == 0 && !ds.dedicated && ds.dev.Capacity >= n && ds.dev.Capacity > 0
}

// dedicable reports whether ds can be dedicated to q: wholeFree, and of
// exactly q's size when q is Exact.
func (x *Index) dedicable(ds *devState, q *req) bool {
	return x.wholeFree(ds, q.Size) && (!q.Exact || q.Whole || ds.dev.Capacity == q.Size)
}

// notWholeReason says why ds cannot be dedicated to a request of size n.
func (x *Index) notWholeReason(ds *devState, n int64) string {
	if len(ds.leases) > 0 {
		return fmt.Sprintf("in use by %d lease(s): dedicated needs an unused device", len(ds.leases))
	}
	k := ds.dev.Kind
	if ds.dev.Capacity > n && n > 0 {
		return fmt.Sprintf("capacity %s: only a device of exactly %s is dedicated to this request", x.amount(k, ds.dev.Capacity), x.amount(k, n))
	}
	return fmt.Sprintf("capacity %s: dedicated needs at least %s", x.amount(k, ds.dev.Capacity), x.amount(k, n))
}

// partitionable is the candidates that may hold a part: not exclusive.
func (x *Index) partitionable(c *cand) bool { return !x.devs[c.dev].exclusive }

// labelled reports whether ds's node carries every selected label.
func (x *Index) labelled(sel map[string]string, ds *devState) bool {
	if ds.node < 0 {
		return false
	}
	labels := x.nodes[ds.node].Labels
	for k, v := range sel {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

// missingLabel names the first selected label (in key order) ds's node
// lacks.
func (x *Index) missingLabel(sel map[string]string, ds *devState) string {
	var labels map[string]string
	if ds.node >= 0 {
		labels = x.nodes[ds.node].Labels
	}
	missing := ""
	for k, v := range sel {
		if lv, ok := labels[k]; ok && lv == v {
			continue
		}
		if t := k + "=" + v; missing == "" || t < missing {
			missing = t
		}
	}
	return missing
}

type labelKV struct{ k, v string }

// labelGroup reports whether anchor group a may hold a device whose node
// carries every selected label: it has, for each, a node with it. The
// label → anchors table is built on first use.
func (x *Index) labelGroup(sel map[string]string, a int32) bool {
	if x.labelAnchors == nil {
		x.labelAnchors = map[labelKV]map[int32]struct{}{}
		for i := range x.devs {
			ds := &x.devs[i]
			if ds.node < 0 {
				continue
			}
			for k, v := range x.nodes[ds.node].Labels {
				m := x.labelAnchors[labelKV{k, v}]
				if m == nil {
					m = map[int32]struct{}{}
					x.labelAnchors[labelKV{k, v}] = m
				}
				m[ds.anchor] = struct{}{}
			}
		}
	}
	for k, v := range sel {
		if _, ok := x.labelAnchors[labelKV{k, v}][a]; !ok {
			return false
		}
	}
	return true
}

func (x *Index) affine(r Request, ds *devState) bool {
	if len(r.Affinity) == 0 && len(r.AntiAffinity) == 0 {
		return true
	}
	var labels map[string]string
	if ds.node >= 0 {
		labels = x.nodes[ds.node].Labels
	}
	match := func(term string) bool {
		if term == ds.dev.Node {
			return true
		}
		if k, v, ok := strings.Cut(term, "="); ok {
			lv, has := labels[k]
			return has && lv == v
		}
		return false
	}
	if len(r.Affinity) > 0 {
		ok := false
		for _, t := range r.Affinity {
			if match(t) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, t := range r.AntiAffinity {
		if match(t) {
			return false
		}
	}
	return true
}
