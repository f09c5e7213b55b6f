package sim

import (
	"math"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/placement"
)

// Cluster is the simulated counterpart of a placement snapshot: one Resource
// per device (capacity and concurrency profile from the snapshot's
// profiles) and one per fabric link, and the fabric paths between borrowers
// and devices. The same snapshot feeds placement's Index, so the simulator
// decides with the control plane's placement and moves bytes over the same
// topology.
type Cluster struct {
	Snap  *placement.Snapshot
	Graph *fabric.Graph
	Index *placement.Index
	Dev   map[string]*Resource
	Links []*Resource

	devs  map[string]placement.Device
	trees map[int]*fabric.Tree
}

// ProfileTable turns a placement profile (delivered bytes/s per concurrency)
// into a Profile of fractions of its first entry.
func ProfileTable(p placement.Profile) (capacity float64, t Table) {
	if len(p.Delivered) == 0 {
		return p.MaxBandwidth, nil
	}
	capacity = p.Delivered[0]
	for _, d := range p.Delivered {
		t = append(t, d/capacity)
	}
	return capacity, t
}

// NewCluster builds the simulated cluster and a placement index for s. The
// snapshot must not change afterwards except through the index.
func NewCluster(s *placement.Snapshot) *Cluster {
	c := &Cluster{Snap: s, Dev: map[string]*Resource{}, devs: map[string]placement.Device{}, trees: map[int]*fabric.Tree{}}
	var extra []string
	for _, n := range s.Nodes {
		extra = append(extra, n.ID)
	}
	for _, d := range s.Devices {
		if d.Attach != "" {
			extra = append(extra, d.Attach)
		}
	}
	c.Graph = fabric.NewGraph(s.Links, extra...)
	for _, l := range s.Links {
		c.Links = append(c.Links, &Resource{Name: l.ID, Capacity: l.Residual()})
	}
	for _, l := range c.Links {
		if math.IsInf(l.Capacity, 1) {
			l.Capacity = 0
		}
	}
	for _, d := range s.Devices {
		r := &Resource{Name: d.ID, Capacity: d.Bandwidth}
		if d.Kind == placement.KindNIC && d.Bandwidth <= 0 {
			// A lent interface: its capacity is the rate it lends.
			r.Capacity = float64(d.Capacity)
		}
		if p, ok := s.Profiles[d.Model]; ok {
			r.Capacity, r.Profile = ProfileTable(p)
		}
		c.Dev[d.ID] = r
		c.devs[d.ID] = d
	}
	c.Index = placement.NewIndex(s)
	return c
}

// Path returns the resources a flow from borrower to device crosses: the
// fabric links of the shortest path (by hops) and the device itself. A
// device on the borrower's own node crosses no link.
//
// Shortest-path trees are kept per source vertex, but a borrower with a
// single link (a server under its top-of-rack switch) starts from its
// neighbour's tree: every path out of a degree-1 vertex begins with its only
// link, and fabric's ties (fewest hops, then latency, then lowest link
// index) pick the same links from the neighbour as from the borrower. So a
// 10,000-node fabric keeps one tree per rack switch instead of one per
// server, and paths are walked on demand rather than cached per pair.
func (c *Cluster) Path(borrower, device string) []*Resource {
	d := c.devs[device]
	at := d.Attach
	if at == "" {
		at = d.Node
	}
	var out []*Resource
	src, ok1 := c.Graph.Vertex(borrower)
	dst, ok2 := c.Graph.Vertex(at)
	if ok1 && ok2 && src != dst {
		var first []int
		if c.Graph.Degree(src) == 1 {
			c.Graph.Neighbors(src, func(to, link int) {
				first = append(first, link)
				src = to
			})
		}
		t := c.trees[src]
		if t == nil {
			t = c.Graph.ShortestPaths(src, fabric.ByHops)
			c.trees[src] = t
		}
		links := t.PathTo(dst)
		if src == dst || links != nil {
			links = append(first, links...)
		}
		out = make([]*Resource, 0, len(links)+1)
		for _, li := range links {
			// Unlimited links never constrain a flow; leaving them out keeps
			// the components Net recomputes small.
			if l := c.Links[li]; l.Capacity > 0 {
				out = append(out, l)
			}
		}
	}
	return append(out, c.Dev[device])
}

// fabricEthernet is an Ethernet link from a node to its switch.
func fabricEthernet(node, sw string, bandwidth float64) fabric.Link {
	return fabric.Link{ID: node, A: node, B: sw, Kind: fabric.Ethernet, Bandwidth: bandwidth, Latency: 10 * time.Microsecond}
}

// Volume is the block volume a lease's parts give borrower.
func (c *Cluster) Volume(borrower string, parts []placement.Part) Volume {
	var v Volume
	for _, p := range parts {
		v.Members = append(v.Members, c.Path(borrower, p.DeviceID))
	}
	return v
}
