package placement

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// randomSnapshot builds a two-level fabric (racks under a spine) with mixed
// devices, some nodes down or suspect, and quotas.
func randomSnapshot(rng *rand.Rand) *Snapshot {
	s := &Snapshot{Profiles: map[string]Profile{SMUFINModel: SMUFINProfile()}, Quotas: map[string]Quota{}}
	racks := 1 + rng.Intn(3)
	for r := 0; r < racks; r++ {
		s.Links = append(s.Links, fabric.Link{ID: fmt.Sprintf("up%d", r), A: fmt.Sprintf("tor%d", r), B: "spine",
			Bandwidth: []float64{0, 5e9, 12.5e9}[rng.Intn(3)], Latency: time.Microsecond, Load: float64(rng.Intn(3)) * 1e9})
	}
	nodes := 3 + rng.Intn(10)
	for i := 0; i < nodes; i++ {
		id := fmt.Sprintf("n%02d", i)
		st := ""
		switch rng.Intn(8) {
		case 0:
			st = NodeDown
		case 1:
			st = NodeSuspect
		}
		s.Nodes = append(s.Nodes, Node{ID: id, State: st, Labels: map[string]string{"rack": fmt.Sprint(i % racks)}})
		s.Links = append(s.Links, fabric.Link{ID: "l" + id, A: id, B: fmt.Sprintf("tor%d", i%racks),
			Bandwidth: []float64{1.25e9, 12.5e9}[rng.Intn(2)], Latency: time.Duration(1+rng.Intn(3)) * time.Microsecond})
		for d := rng.Intn(4); d > 0; d-- {
			dev := Device{ID: fmt.Sprintf("%s-d%d", id, d), Node: id, Capacity: int64(1+rng.Intn(8)) << 30}
			switch rng.Intn(4) {
			case 0:
				dev.Kind, dev.Model = KindBlock, SMUFINModel
			case 1:
				dev.Kind, dev.Bandwidth = KindMemory, 10e9
			case 2:
				dev.Kind, dev.Capacity = KindAccel, int64(1+rng.Intn(4))
			case 3:
				dev.Kind, dev.Capacity = KindNIC, int64(1+rng.Intn(4))*125e6 // 1..4 Gbit/s
			}
			if rng.Intn(10) == 0 {
				dev.State = "failed"
			}
			dev.Exclusive = rng.Intn(5) == 0
			s.Devices = append(s.Devices, dev)
		}
	}
	s.Quotas["t0"] = Quota{Leases: 3, Bytes: 6 << 30, Slots: 3, Bandwidth: 2e9}
	s.DefaultQuota = Quota{Leases: 4, Bytes: 8 << 30, Slots: 4}
	return s
}

func randomRequest(rng *rand.Rand, s *Snapshot) Request {
	r := Request{Borrower: s.Nodes[rng.Intn(len(s.Nodes))].ID, Tenant: fmt.Sprintf("t%d", rng.Intn(2)),
		AllowShare: rng.Intn(3) > 0, AllowCompose: rng.Intn(2) == 0}
	switch rng.Intn(4) {
	case 3:
		r.Kind, r.Size = KindNIC, int64(1+rng.Intn(8))*62.5e6 // 500 Mbit/s .. 4 Gbit/s
		if rng.Intn(3) == 0 {
			r.Bandwidth = float64(r.Size) / 2
		}
		if rng.Intn(3) == 0 {
			r.Mode, r.Width = ModeComposed, 2+rng.Intn(2)
		}
	case 0:
		r.Kind, r.Size = KindBlock, int64(1+rng.Intn(3))<<30
		r.Bandwidth = float64(rng.Intn(3)) * SMUFINWriterDemand
	case 1:
		r.Kind, r.Size = KindMemory, int64(1+rng.Intn(4))<<28
		r.Bandwidth = float64(rng.Intn(3)) * 1e9
	case 2:
		r.Kind, r.Size = KindAccel, int64(1+rng.Intn(2))
		r.Exact = rng.Intn(2) == 0
	}
	if rng.Intn(3) == 0 {
		r.Work = int64(1+rng.Intn(100)) << 30
		if rng.Intn(2) == 0 {
			r.Deadline = time.Duration(10+rng.Intn(600)) * time.Second
		}
	}
	if rng.Intn(2) == 0 {
		r.Strategy = Spread
	}
	// Whole devices, label selectors and pins.
	switch rng.Intn(8) {
	case 0:
		if r.Kind != KindAccel {
			r.Whole, r.Size = true, int64(rng.Intn(2))*r.Size
			r.AllowShare, r.AllowCompose = false, false
			if rng.Intn(2) == 0 {
				r.Mode = ModeDedicated
			}
		}
	case 1:
		r.Labels = map[string]string{"rack": fmt.Sprint(rng.Intn(3))}
	case 2:
		for _, d := range s.Devices {
			if rng.Intn(3) == 0 {
				r.Devices = append(r.Devices, d.ID)
			}
		}
	case 3:
		if r.Mode == "" {
			r.Mode = []string{ModeDedicated, ModeShared, ModeComposed}[rng.Intn(3)]
		}
	}
	if r.Whole || r.Mode != ModeComposed {
		r.Width = 0
	}
	return r
}

// checkPlan verifies what a plan owes its request: whole requests get a
// whole device, selectors and pins hold, exclusive devices are never
// shared or composed.
func checkPlan(t *testing.T, s *Snapshot, r Request, p Plan) {
	t.Helper()
	dev := map[string]Device{}
	for _, d := range s.Devices {
		dev[d.ID] = d
	}
	node := map[string]Node{}
	for _, n := range s.Nodes {
		node[n.ID] = n
	}
	var held int64
	for _, pt := range p.Parts {
		held += pt.Length
	}
	if (r.Exact || r.Kind == KindNIC) && !r.Whole && p.Mode != ModeComposed && held != r.Size {
		t.Fatalf("exact request %+v holds %d: %v", r, held, p)
	}
	if r.Kind == KindNIC && p.Mode == ModeComposed {
		lenders := map[string]bool{}
		for _, pt := range p.Parts {
			if lenders[pt.NodeID] {
				t.Fatalf("bond %v has two parts on lender %s", p, pt.NodeID)
			}
			lenders[pt.NodeID] = true
		}
	}
	for _, pt := range p.Parts {
		d := dev[pt.DeviceID]
		if d.Kind != r.Kind {
			t.Fatalf("plan %v: device %s is %s, asked %s", p, d.ID, d.Kind, r.Kind)
		}
		if r.Whole && (p.Mode != ModeDedicated || pt.Offset != 0 || pt.Length != d.Capacity || d.Capacity < r.Size) {
			t.Fatalf("whole request %+v got %v", r, p)
		}
		if d.Exclusive && p.Mode != ModeDedicated {
			t.Fatalf("exclusive device %s placed %s: %v", d.ID, p.Mode, p)
		}
		for k, v := range r.Labels {
			if node[d.Node].Labels[k] != v {
				t.Fatalf("plan %v: node %s lacks selected %s=%s", p, d.Node, k, v)
			}
		}
		if len(r.Devices) > 0 && !slices.Contains(r.Devices, d.ID) {
			t.Fatalf("plan %v: device %s not among the pinned %v", p, d.ID, r.Devices)
		}
	}
}

// checkInvariants verifies that the snapshot's leases do not over-commit any
// device (space, exclusivity) or any device or link bandwidth, that no lease
// was placed on a down or suspect node, and that quotas hold.
func checkInvariants(t *testing.T, s *Snapshot, downParts map[string]bool) {
	t.Helper()
	dev := map[string]Device{}
	for _, d := range s.Devices {
		dev[d.ID] = d
	}
	type rng struct{ off, end int64 }
	used := map[string][]rng{}
	holders := map[string]int{}
	dedicated := map[string]bool{}
	use := map[string]*usage{}
	for _, l := range s.Leases {
		u := use[l.Tenant]
		if u == nil {
			u = &usage{}
			use[l.Tenant] = u
		}
		u.leases++
		u.bandwidth += l.Demand
		var rate int64
		for _, p := range l.Parts {
			d := dev[p.DeviceID]
			if d.Kind == KindNIC { // a rate: it counts as the lease's bandwidth
				rate += p.Length
			}
			used[p.DeviceID] = append(used[p.DeviceID], rng{p.Offset, p.Offset + p.Length})
			holders[p.DeviceID]++
			if l.Mode == ModeDedicated {
				dedicated[p.DeviceID] = true
			}
			n := p.Length
			switch d.Kind {
			case KindAccel:
				u.slots += n
			case KindNIC:
			default:
				u.bytes += n
			}
		}
		if rate > 0 && (l.Demand <= 0 || l.Demand > float64(rate)) {
			u.bandwidth += float64(rate) - l.Demand
		}
	}
	for id, rs := range used {
		sort.Slice(rs, func(i, j int) bool { return rs[i].off < rs[j].off })
		for i, r := range rs {
			if r.off < 0 || r.end > dev[id].Capacity {
				t.Fatalf("device %s: part [%d,%d) outside capacity %d", id, r.off, r.end, dev[id].Capacity)
			}
			if i > 0 && r.off < rs[i-1].end {
				t.Fatalf("device %s: overlapping parts %v", id, rs)
			}
		}
		if dedicated[id] && holders[id] != 1 {
			t.Fatalf("device %s dedicated but held by %d leases", id, holders[id])
		}
		if dev[id].Exclusive && (holders[id] != 1 || !dedicated[id]) {
			t.Fatalf("exclusive device %s held by %d leases (dedicated: %v)", id, holders[id], dedicated[id])
		}
	}
	for tenant, u := range use {
		q, ok := s.Quotas[tenant]
		if !ok {
			q = s.DefaultQuota
		}
		if (q.Leases > 0 && u.leases > q.Leases) || (q.Bytes > 0 && u.bytes > q.Bytes) || (q.Slots > 0 && u.slots > q.Slots) || (q.Bandwidth > 0 && u.bandwidth > q.Bandwidth+1e-6) {
			t.Fatalf("tenant %s over quota: %+v > %+v", tenant, *u, q)
		}
	}
	for id := range used {
		if downParts[id] {
			t.Fatalf("device %s on a down/suspect node or unhealthy was placed", id)
		}
	}
	// Bandwidth: Predict's rates respect every device's delivered bandwidth
	// and every link's residual bandwidth.
	x := NewIndex(s)
	for r := range x.res {
		c := x.resCap(r, len(x.res[r].leases))
		if math.IsInf(c, 1) {
			continue
		}
		if x.res[r].load > c*(1+1e-9)+1e-3 {
			t.Fatalf("resource %d over-committed: load %v > capacity %v", r, x.res[r].load, c)
		}
	}
}

func TestPropertyRandom(t *testing.T) {
	rounds := 40
	if testing.Short() {
		rounds = 15
	}
	for seed := int64(1); seed <= int64(rounds); seed++ {
		rng := rand.New(rand.NewSource(seed))
		s := randomSnapshot(rng)
		bad := map[string]bool{}
		state := map[string]string{}
		for _, n := range s.Nodes {
			state[n.ID] = n.State
		}
		for _, d := range s.Devices {
			if (state[d.Node] != "" && state[d.Node] != NodeReady) || d.State != "" {
				bad[d.ID] = true
			}
		}
		x := NewIndex(s)
		for i := 0; i < 25; i++ {
			r := randomRequest(rng, s)
			p1, err1 := Place(s, r)
			p2, err2 := Place(s, r)
			if !reflect.DeepEqual(p1, p2) || fmt.Sprint(err1) != fmt.Sprint(err2) {
				t.Fatalf("seed %d: nondeterministic plan\n%v\n%v", seed, p1, p2)
			}
			// The incremental index agrees with a fresh one on parts and mode.
			p3, err3 := x.Place(r)
			if fmt.Sprint(err1) != fmt.Sprint(err3) || p1.String() != p3.String() {
				t.Fatalf("seed %d step %d: index %v (%v) vs fresh %v (%v)\n%s\n%s", seed, i, p3, err3, p1, err1, strings.Join(p3.Explanation, "\n"), strings.Join(p1.Explanation, "\n"))
			}
			if err1 != nil {
				if !errors.Is(err1, ErrInfeasible) && !errors.Is(err1, ErrInvalid) {
					t.Fatalf("seed %d: %v", seed, err1)
				}
				continue
			}
			checkPlan(t, s, r, p1)
			l := p1.Lease(fmt.Sprintf("L%d", i), r, s.Now)
			s.Leases = append(s.Leases, l)
			if err := x.Add(l); err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, s, bad)
			if rng.Intn(4) == 0 && len(s.Leases) > 0 {
				k := rng.Intn(len(s.Leases))
				if err := x.Remove(s.Leases[k].ID); err != nil {
					t.Fatal(err)
				}
				s.Leases = append(s.Leases[:k], s.Leases[k+1:]...)
			}
		}
	}
}

// TestShuffledSnapshot: the order of nodes, devices and links in the
// snapshot does not change the plan.
func TestShuffledSnapshot(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewSource(seed))
		s := randomSnapshot(rng)
		for i := 0; i < 10; i++ {
			r := randomRequest(rng, s)
			p, err := Place(s, r)
			if err == nil {
				s.Leases = append(s.Leases, p.Lease(fmt.Sprintf("L%d", i), r, 0))
			}
		}
		c := *s
		c.Nodes = append([]Node(nil), s.Nodes...)
		c.Devices = append([]Device(nil), s.Devices...)
		c.Links = append([]fabric.Link(nil), s.Links...)
		rng.Shuffle(len(c.Nodes), func(i, j int) { c.Nodes[i], c.Nodes[j] = c.Nodes[j], c.Nodes[i] })
		rng.Shuffle(len(c.Devices), func(i, j int) { c.Devices[i], c.Devices[j] = c.Devices[j], c.Devices[i] })
		rng.Shuffle(len(c.Links), func(i, j int) { c.Links[i], c.Links[j] = c.Links[j], c.Links[i] })
		for i := 0; i < 10; i++ {
			r := randomRequest(rng, s)
			p1, err1 := Place(s, r)
			p2, err2 := Place(&c, r)
			if p1.String() != p2.String() || (err1 == nil) != (err2 == nil) {
				t.Fatalf("seed %d: order-dependent plan %v (%v) vs %v (%v)", seed, p1, err1, p2, err2)
			}
		}
	}
}

// TestLabelSelectorLargeGroups: with more than 16 devices under a switch,
// candidates skips whole groups whose nodes lack a selected label; the
// selector still finds the labelled devices behind them, and a selector
// nobody matches is refused on the labels constraint.
func TestLabelSelectorLargeGroups(t *testing.T) {
	s := &Snapshot{}
	for r := 0; r < 3; r++ {
		tor := fmt.Sprintf("tor%d", r)
		s.Links = append(s.Links, fabric.Link{ID: tor, A: tor, B: "spine", Bandwidth: 50e9})
		for n := 0; n < 8; n++ {
			id := fmt.Sprintf("n%d-%d", r, n)
			s.Nodes = append(s.Nodes, Node{ID: id, Labels: map[string]string{"rack": tor, "n": fmt.Sprint(n)}})
			s.Links = append(s.Links, fabric.Link{ID: id, A: id, B: tor, Bandwidth: 12.5e9})
			for d := 0; d < 3; d++ {
				s.Devices = append(s.Devices, Device{ID: fmt.Sprintf("%s-d%d", id, d), Node: id, Kind: KindBlock, Capacity: 1 << 40, Exclusive: d == 2})
			}
		}
	}
	for _, c := range []struct {
		labels map[string]string
		node   string // prefix of the chosen node; "" for infeasible
	}{
		{map[string]string{"rack": "tor0"}, "n0-"},
		{map[string]string{"rack": "tor2"}, "n2-"},
		{map[string]string{"rack": "tor1", "n": "5"}, "n1-5"},
		{map[string]string{"rack": "tor9"}, ""},
	} {
		for _, r := range []Request{
			{Kind: KindBlock, Size: 1 << 30, Borrower: "n0-0", AllowShare: true, Labels: c.labels},
			{Kind: KindBlock, Whole: true, Borrower: "n0-0", Labels: c.labels},
		} {
			p, err := Place(s, r)
			if c.node == "" {
				var ie *InfeasibleError
				if !errors.As(err, &ie) || ie.Constraint != ConstraintLabels {
					t.Fatalf("%v: %v, want infeasible on labels", c.labels, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%v: %v", c.labels, err)
			}
			checkPlan(t, s, r, p)
			if !strings.HasPrefix(p.Parts[0].NodeID, c.node) {
				t.Fatalf("%v: placed on %s, want %s*", c.labels, p.Parts[0].NodeID, c.node)
			}
		}
	}
}
