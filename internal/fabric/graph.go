package fabric

import (
	"container/heap"
	"math"
	"sort"
	"time"
)

// Kind is a link technology.
type Kind string

// Link kinds.
const (
	Ethernet Kind = "ethernet"
	PCIeNTB  Kind = "pcie-ntb" // a non-transparent bridge between two PCIe roots
	PCIe     Kind = "pcie"     // a transparent PCIe link (switch, root port)
	Mesh     Kind = "mesh"     // a direct node-to-node link of a mesh (Venice)
	Loopback Kind = "loopback"
)

// Link is an undirected edge of the topology between vertices A and B (host,
// switch or PCIe root IDs). Bandwidth is in bytes/s (0 means unlimited),
// Latency is one way; a pcie-ntb link with no Latency is given
// NTBCrossingLatency. Load is background traffic in bytes/s that is not
// carried by any flow the caller shares with MaxMin. Down links carry nothing
// and are never on a path.
type Link struct {
	ID        string
	A, B      string
	Kind      Kind
	Bandwidth float64
	Latency   time.Duration
	Load      float64
	Down      bool
}

// EffectiveLatency is the link's one-way latency with the NTB rule applied.
func (l Link) EffectiveLatency() time.Duration {
	if l.Latency == 0 && l.Kind == PCIeNTB {
		return NTBCrossingLatency
	}
	return l.Latency
}

// Residual is the bandwidth left after background load (+Inf when the link
// is unlimited, 0 when it is down).
func (l Link) Residual() float64 {
	if l.Down {
		return 0
	}
	if l.Bandwidth <= 0 {
		return math.Inf(1)
	}
	if r := l.Bandwidth - l.Load; r > 0 {
		return r
	}
	return 0
}

type edge struct {
	to   int32
	link int32
}

// Graph is an immutable topology. Vertex and link indices are dense and
// stable for the Graph's life: links keep the order given to NewGraph;
// vertices are numbered in sorted ID order.
type Graph struct {
	ids   []string
	index map[string]int
	links []Link
	adj   [][]edge
}

// NewGraph builds a graph from links; vertices are the links' endpoints plus
// any extra vertex IDs (isolated hosts).
func NewGraph(links []Link, extra ...string) *Graph {
	set := make(map[string]struct{}, len(links)+len(extra))
	for _, l := range links {
		set[l.A] = struct{}{}
		set[l.B] = struct{}{}
	}
	for _, v := range extra {
		set[v] = struct{}{}
	}
	g := &Graph{index: make(map[string]int, len(set)), links: append([]Link(nil), links...)}
	g.ids = make([]string, 0, len(set))
	for id := range set {
		g.ids = append(g.ids, id)
	}
	sort.Strings(g.ids)
	for i, id := range g.ids {
		g.index[id] = i
	}
	g.adj = make([][]edge, len(g.ids))
	for i, l := range g.links {
		if l.Down || l.A == l.B {
			continue
		}
		a, b := g.index[l.A], g.index[l.B]
		g.adj[a] = append(g.adj[a], edge{int32(b), int32(i)})
		g.adj[b] = append(g.adj[b], edge{int32(a), int32(i)})
	}
	return g
}

// Len is the number of vertices.
func (g *Graph) Len() int { return len(g.ids) }

// Vertex returns the index of a vertex ID.
func (g *Graph) Vertex(id string) (int, bool) {
	v, ok := g.index[id]
	return v, ok
}

// ID returns the ID of vertex v.
func (g *Graph) ID(v int) string { return g.ids[v] }

// Links returns the graph's links (shared; do not modify).
func (g *Graph) Links() []Link { return g.links }

// Degree is the number of up links at vertex v.
func (g *Graph) Degree(v int) int { return len(g.adj[v]) }

// Neighbors calls f for each up link at v with the neighbour and link index.
func (g *Graph) Neighbors(v int, f func(to, link int)) {
	for _, e := range g.adj[v] {
		f(int(e.to), int(e.link))
	}
}

// Metric orders paths.
type Metric int

// Path metrics: ByHops compares hop count, then latency; ByLatency compares
// latency, then hop count. Remaining ties go to the lower link index, so
// paths are deterministic.
const (
	ByHops Metric = iota
	ByLatency
)

// Distance is the length of a path.
type Distance struct {
	Hops    int
	Latency time.Duration
}

// Unreachable is the Distance of a vertex with no path.
var Unreachable = Distance{Hops: math.MaxInt32, Latency: math.MaxInt64}

// Less orders distances by the metric.
func (d Distance) Less(e Distance, m Metric) bool {
	if m == ByLatency {
		if d.Latency != e.Latency {
			return d.Latency < e.Latency
		}
		return d.Hops < e.Hops
	}
	if d.Hops != e.Hops {
		return d.Hops < e.Hops
	}
	return d.Latency < e.Latency
}

// Tree is a shortest-path tree from one source.
type Tree struct {
	Source int
	Metric Metric
	Dist   []Distance // per vertex; Unreachable when there is no path
	Parent []int32    // link index into the parent, -1 at the source or when unreachable
	g      *Graph
}

// ShortestPaths runs Dijkstra from src under metric m.
func (g *Graph) ShortestPaths(src int, m Metric) *Tree {
	t := &Tree{Source: src, Metric: m, g: g, Dist: make([]Distance, len(g.ids)), Parent: make([]int32, len(g.ids))}
	for i := range t.Dist {
		t.Dist[i] = Unreachable
		t.Parent[i] = -1
	}
	t.Dist[src] = Distance{}
	h := &distHeap{m: m}
	heap.Push(h, distItem{v: int32(src)})
	done := make([]bool, len(g.ids))
	for h.Len() > 0 {
		it := heap.Pop(h).(distItem)
		v := int(it.v)
		if done[v] {
			continue
		}
		done[v] = true
		for _, e := range g.adj[v] {
			l := g.links[e.link]
			nd := Distance{Hops: t.Dist[v].Hops + 1, Latency: t.Dist[v].Latency + l.EffectiveLatency()}
			w := int(e.to)
			if done[w] {
				continue
			}
			if nd.Less(t.Dist[w], m) || (nd == t.Dist[w] && e.link < t.Parent[w]) {
				t.Dist[w] = nd
				t.Parent[w] = e.link
				heap.Push(h, distItem{v: e.to, d: nd})
			}
		}
	}
	return t
}

// PathTo returns the link indices from the source to dst, source side first,
// or nil when dst is the source or unreachable (check Dist).
func (t *Tree) PathTo(dst int) []int {
	var rev []int
	for v := dst; v != t.Source; {
		li := t.Parent[v]
		if li < 0 {
			return nil
		}
		rev = append(rev, int(li))
		l := t.g.links[li]
		if t.g.index[l.A] == v {
			v = t.g.index[l.B]
		} else {
			v = t.g.index[l.A]
		}
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

// Path returns the shortest path between two vertex IDs under m, and its
// distance; ok is false when either is unknown or there is no path.
func (g *Graph) Path(from, to string, m Metric) (links []int, d Distance, ok bool) {
	a, ok1 := g.index[from]
	b, ok2 := g.index[to]
	if !ok1 || !ok2 {
		return nil, Unreachable, false
	}
	t := g.ShortestPaths(a, m)
	if t.Dist[b] == Unreachable {
		return nil, Unreachable, false
	}
	return t.PathTo(b), t.Dist[b], true
}

type distItem struct {
	v int32
	d Distance
}

type distHeap struct {
	items []distItem
	m     Metric
}

func (h *distHeap) Len() int { return len(h.items) }
func (h *distHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	if a.d != b.d {
		return a.d.Less(b.d, h.m)
	}
	return a.v < b.v
}
func (h *distHeap) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *distHeap) Push(x any)    { h.items = append(h.items, x.(distItem)) }
func (h *distHeap) Pop() any {
	n := len(h.items) - 1
	it := h.items[n]
	h.items = h.items[:n]
	return it
}
