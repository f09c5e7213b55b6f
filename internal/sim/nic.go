package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/rialto-project/rialto/internal/placement"
)

// The lent-NIC model (docs/nic.md). A borrower's packet enters its TUN
// interface, crosses the rack as a DATA frame of a TCP connection to the
// lender (the tunnel, with credit-based flow control per connection), waits
// for the lease's token bucket at the lender and leaves through the lent
// interface, where it is the same packet a program on the lender would
// send. Everything is counted per byte of UDP payload: a packet of p bytes
// of payload is an IPv4 packet of p+28 bytes,
//
//   - on the lent interface (and on any link used directly) p+42 bytes:
//     what tc tbf and the interface counters count (Ethernet header 14);
//   - on every rack link the tunnel crosses (p+28+TunnelHeader) bytes of
//     TCP stream, which a loaded connection sends in full segments of MSS
//     bytes, each TCPSegmentOverhead bytes more on the link: so the tunnel
//     packs small packets into large segments and adds a little to large
//     ones;
//   - at the lender's token bucket the IPv4 packet (p+28 bytes);
//   - on the connection's credit window the IPv4 packet too: at most 3/4 of
//     the window per round trip (credit returns once a quarter of the
//     window is consumed);
//   - optionally a forwarding time per packet at each end of the tunnel.
//
// Each of these is a Resource the flows of a lease cross with its own
// coefficient (Flow.Coef), so max-min sharing in Net gives every flow the
// rate the tightest of them allows.

const (
	// TunnelHeader is the tunnel's frame header (nic.HeaderSize).
	TunnelHeader = 8
	// TunnelWindow is a tunnel connection's credit window
	// (nic.DefaultWindow).
	TunnelWindow = 512 << 10
	// UDPIPOverhead is what an IPv4 packet adds to its UDP payload: UDP 8,
	// IPv4 20.
	UDPIPOverhead = 28
	// EthernetHeader is what a frame adds to its IP packet in the bytes tc
	// tbf and the interface counters count (no FCS, preamble or gap).
	EthernetHeader = 14
	// TCPSegmentOverhead is what a TCP segment adds to its payload on such
	// a link: Ethernet 14, IPv4 20, TCP 20 and 12 bytes of timestamps.
	TCPSegmentOverhead = 66
	// DefaultMSS is the segment payload of a TCP connection over a
	// 1,500-byte MTU with timestamps.
	DefaultMSS = 1448
)

// Tunnel is a lent NIC's tunnel as the model sees it.
type Tunnel struct {
	// Window is each connection's credit window in bytes of DATA (IPv4
	// packets); RTT the round trip over which credit returns.
	Window int
	RTT    time.Duration
	// MSS is the outer TCP connection's segment payload.
	MSS int
	// SegmentsPerPacket, when set, is how many TCP segments the tunnel
	// sends per packet (what the lab counts on the tunnel's link); 0
	// assumes full segments. The tunnel's TCP fills its segments when its
	// own link is the bottleneck (the kernel then holds the data and
	// segments it); when a link beyond is, each write of the tunnel leaves
	// at once as its own segments, and how many packets a write carries
	// depends on how fast the tunnel's writer is woken.
	SegmentsPerPacket float64
	// PerPacket is the forwarding time per packet at each end of the
	// tunnel (user-space work: a TUN read or write and its share of a
	// socket call); 0 models ends that keep up with any packet rate.
	PerPacket time.Duration
}

// DefaultTunnel is Rialto's tunnel on the emulated rack: the data plane's
// window, a 1 ms round trip (an assumption: any round trip below 0.1 s
// leaves the window far from binding at the rack's rates), full-size
// segments, ends that keep up.
var DefaultTunnel = Tunnel{Window: TunnelWindow, RTT: time.Millisecond, MSS: DefaultMSS}

// FrameCoef is the bytes a link used directly (or the lent interface)
// carries per byte of UDP payload in packets of payload bytes.
func FrameCoef(payload int) float64 {
	return float64(payload+UDPIPOverhead+EthernetHeader) / float64(payload)
}

// IPCoef is the IPv4 bytes per byte of UDP payload.
func IPCoef(payload int) float64 { return float64(payload+UDPIPOverhead) / float64(payload) }

// WireCoef is the bytes a rack link carrying the tunnel counts per byte of
// UDP payload in packets of payload bytes.
func (t Tunnel) WireCoef(payload int) float64 {
	if t.SegmentsPerPacket > 0 {
		return (float64(payload+UDPIPOverhead+TunnelHeader) + TCPSegmentOverhead*t.SegmentsPerPacket) / float64(payload)
	}
	mss := t.MSS
	if mss <= 0 {
		mss = DefaultMSS
	}
	return float64(payload+UDPIPOverhead+TunnelHeader) * float64(mss+TCPSegmentOverhead) / float64(mss) / float64(payload)
}

// FullSegments is the segments per packet of a tunnel whose segments are
// full: (payload+36)/MSS.
func (t Tunnel) FullSegments(payload int) float64 {
	mss := t.MSS
	if mss <= 0 {
		mss = DefaultMSS
	}
	return float64(payload+UDPIPOverhead+TunnelHeader) / float64(mss)
}

// CreditRate is the most DATA (IPv4 bytes/s) one connection's credit lets
// through: three quarters of the window per round trip (0: unbounded).
func (t Tunnel) CreditRate() float64 {
	if t.Window <= 0 || t.RTT <= 0 {
		return 0
	}
	return 0.75 * float64(t.Window) / t.RTT.Seconds()
}

// NICRequest is the placement request the control plane makes of `rialto
// lease create --kind nic` (internal/controlplane's placementRequest): a
// share of rate bytes/s of one lender's interface, a whole interface
// (rate 0), or a bond of count lenders holding rate between them.
func NICRequest(borrower string, rate float64, count int) placement.Request {
	r := placement.Request{Kind: placement.KindNIC, Borrower: borrower, Size: int64(math.Round(rate)), Bandwidth: rate}
	switch {
	case count > 1:
		r.Mode, r.Width, r.AllowCompose = placement.ModeComposed, count, true
	case rate <= 0:
		r.Whole, r.AllowShare = true, true
	default:
		r.AllowShare = true
	}
	return r
}

// NICPath is one flow's way through a nic lease part: the resources it
// crosses and its coefficient on each.
type NICPath struct {
	Path []*Resource
	Coef []float64
}

// NICPaths returns the paths of a nic lease's parts for packets of payload
// bytes from borrower: per part, the fabric links from the borrower to the
// lender (carrying the tunnel), the part's credit window, the lender's
// token bucket at the part's rate (its length, bytes/s of IPv4), the
// tunnel's ends when t.PerPacket is set (the borrower's end shared by every
// part), and the lent interface (the device).
func (c *Cluster) NICPaths(borrower string, parts []placement.Part, t Tunnel, payload int) []NICPath {
	p := float64(payload)
	var bend *Resource
	if t.PerPacket > 0 {
		bend = &Resource{Name: "tunnel end at " + borrower, Capacity: 1 / t.PerPacket.Seconds()}
	}
	out := make([]NICPath, 0, len(parts))
	for _, pt := range parts {
		full := c.Path(borrower, pt.DeviceID)
		links, dev := full[:len(full)-1], full[len(full)-1]
		var np NICPath
		for _, l := range links {
			np.Path = append(np.Path, l)
			np.Coef = append(np.Coef, t.WireCoef(payload))
		}
		if cr := t.CreditRate(); cr > 0 {
			np.Path = append(np.Path, &Resource{Name: "credit window to " + pt.NodeID, Capacity: cr})
			np.Coef = append(np.Coef, IPCoef(payload))
		}
		if pt.Length > 0 {
			np.Path = append(np.Path, &Resource{Name: "lease rate at " + pt.NodeID, Capacity: float64(pt.Length)})
			np.Coef = append(np.Coef, IPCoef(payload))
		}
		if bend != nil {
			np.Path = append(np.Path, bend, &Resource{Name: "tunnel end at " + pt.NodeID, Capacity: 1 / t.PerPacket.Seconds()})
			np.Coef = append(np.Coef, 1/p, 1/p)
		}
		np.Path = append(np.Path, dev)
		np.Coef = append(np.Coef, FrameCoef(payload))
		out = append(out, np)
	}
	return out
}

// DirectPath is the path of a flow the lender itself sends through its
// interface device: the interface alone.
func (c *Cluster) DirectPath(device string, payload int) NICPath {
	return NICPath{Path: []*Resource{c.Dev[device]}, Coef: []float64{FrameCoef(payload)}}
}

// NICLoad runs flows over paths, flows per path, each offering offer bytes/s of
// payload (0: as much as it can get) and moving bytes; it returns the
// aggregate payload rate (all bytes over the last flow's completion) and
// the events run.
func NICLoad(paths []NICPath, flows int, offer, bytes float64) (float64, uint64) {
	var e Engine
	net := NewNet(&e)
	total := 0.0
	for _, p := range paths {
		for range max(flows, 1) {
			net.StartCoef(bytes, p.Path, p.Coef, offer, nil)
			total += bytes
		}
	}
	end := e.Run(0)
	if end <= 0 {
		return math.Inf(1), e.Events()
	}
	return total / end, e.Events()
}

// NICRackSpec is the emulated rack of the lent-NIC experiments: lenders
// whose uplinks (the lent interfaces, lent whole at their rate) and rack
// links tc tbf shapes, and a borrower whose own rack link is shaped too.
// Rates in bits/s.
type NICRackSpec struct {
	Lenders                          int
	UplinkRate                       float64
	LenderLinkRate, BorrowerLinkRate float64
	Tunnel                           Tunnel
	// Sizes are the UDP payload sizes of the efficiency experiment;
	// BondPayload the one of the bond experiment, FlowsPerLender its UDP
	// flows per lender of a bond.
	Sizes          []int
	BondPayload    int
	FlowsPerLender int
}

// DefaultNICRack: three lenders with 40 Mbit/s uplinks and rack links (the
// lenders' rack links carry the tunnel at the uplinks' rate, so its
// framing shows), a borrower on a 100 Mbit/s link (a bond of three exceeds
// it).
var DefaultNICRack = NICRackSpec{Lenders: 3, UplinkRate: 40e6, LenderLinkRate: 40e6, BorrowerLinkRate: 100e6,
	Tunnel: DefaultTunnel, Sizes: []int{16, 64, 256, 1024, 1472}, BondPayload: 1472, FlowsPerLender: 2}

// Snapshot is the rack as placement sees it: the borrower and the lenders
// under one switch, each lender lending its uplink as nic device "wan" of
// the uplink's rate in bytes/s.
func (sp NICRackSpec) Snapshot() *placement.Snapshot {
	s := &placement.Snapshot{}
	link := func(id string, rate float64) {
		s.Nodes = append(s.Nodes, placement.Node{ID: id})
		s.Links = append(s.Links, fabricEthernet(id, "bridge", rate/8))
	}
	link("borrower", sp.BorrowerLinkRate)
	for i := 1; i <= sp.Lenders; i++ {
		id := fmt.Sprintf("node%d", i)
		link(id, sp.LenderLinkRate)
		s.Devices = append(s.Devices, placement.Device{ID: fmt.Sprintf("wan%d", i), Node: id, Kind: placement.KindNIC, Capacity: int64(sp.UplinkRate / 8)})
	}
	return s
}

// NICEfficiency is lent-NIC goodput over the same interface used directly
// by its lender, for UDP packets of payload bytes: one whole-interface
// lease of the rack's first lender, placed by placement, one flow offering
// 5% more than the interface carries.
func NICEfficiency(sp NICRackSpec, payload int) (eff, lent, direct float64, events uint64, err error) {
	c := NewCluster(sp.Snapshot())
	req := NICRequest("borrower", 0, 1)
	req.Affinity = []string{"node1"}
	plan, err := c.Index.Place(req)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	offer := 1.05 * sp.UplinkRate / 8 / FrameCoef(payload)
	const bytes = 1e6
	lent, ev1 := NICLoad(c.NICPaths("borrower", plan.Parts, sp.Tunnel, payload), 1, offer, bytes)
	direct, ev2 := NICLoad([]NICPath{c.DirectPath(plan.Parts[0].DeviceID, payload)}, 1, offer, bytes)
	return lent / direct, lent, direct, ev1 + ev2, nil
}

// NICBond is the aggregate goodput of a bond of n lenders (n = 1: one
// whole interface) placed by placement on the rack, FlowsPerLender UDP
// flows per lender offering 5% more than a lender's interface carries at
// BondPayload bytes; predicted is placement's own prediction of the
// lease's bandwidth (bytes/s of lent rate, which knows neither the
// tunnel's framing nor the packets' headers).
func NICBond(sp NICRackSpec, n int) (goodput float64, plan placement.Plan, events uint64, err error) {
	c := NewCluster(sp.Snapshot())
	req := NICRequest("borrower", 0, 1)
	if n > 1 {
		req = NICRequest("borrower", float64(n)*sp.UplinkRate/8, n)
	}
	plan, err = c.Index.Place(req)
	if err != nil {
		return 0, plan, 0, err
	}
	p := sp.BondPayload
	offer := 1.05 * sp.UplinkRate / 8 / FrameCoef(p) / float64(max(sp.FlowsPerLender, 1))
	g, ev := NICLoad(c.NICPaths("borrower", plan.Parts, sp.Tunnel, p), sp.FlowsPerLender, offer, 1e6)
	return g, plan, ev, nil
}
