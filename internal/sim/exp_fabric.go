package sim

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

func init() {
	register("udp-throughput", "seed 004: UDP messages/s and goodput vs payload on 10 GbE, network-attached FPGA (line rate) vs native, container and VM software stacks", runUDP)
	register("hop-latency", "seed 003 Table 1 / Fig. 14: GPU-to-GPU ping-pong latency per scenario from roots, hops and NTB crossings on the fabric model", runHopLatency)
}

// udpSender sends messages as fast as its stack allows (perMsg seconds of
// software per message, 0 for the FPGA's hardware stack) onto a link that
// serialises wire bytes at lineRate bits/s; it returns messages per second
// over horizon seconds of virtual time.
func udpSender(lineRate float64, payload int, perMsg Time, horizon Time) (float64, uint64) {
	var e Engine
	wire := 1 / fabric.UDPMessageRate(lineRate, payload) // seconds on the wire per message
	var linkFree Time
	sent := 0
	var next func()
	next = func() {
		// The stack hands over a message, the link serialises it; the sender
		// may prepare the next one meanwhile but never runs ahead of the link.
		start := math.Max(e.Now(), linkFree)
		linkFree = start + wire
		sent++
		d := math.Max(perMsg, linkFree-e.Now())
		if e.Now()+d < horizon {
			e.After(d, next)
		}
	}
	e.At(0, next)
	e.Run(0)
	return float64(sent) / horizon, e.Events()
}

func runUDP(ctx context.Context, o Options) (Result, error) {
	const lineRate = 10e9
	stacks := []struct {
		name   string
		perMsg Time
	}{
		{"FPGA (hardware UDP)", 0},
		{"native", 1 / 0.32e6},
		{"container", 1 / 0.28e6},
		{"VM", 1 / 0.2e6},
	}
	payloads := []int{1, 16, 64, 128, 256, 512, 1024, 1472}
	horizon := 2e-3 * o.scale()
	r := Result{Header: []string{"stack", "payload_B", "msgs_per_s", "goodput_Gbps", "formula_Gbps"}}
	r.Plot = Plot{Title: "UDP throughput vs payload on 10 GbE (seed 004)", XLabel: "payload (bytes)", YLabel: "goodput (Gb/s)", LogX: true, LogY: true}
	var at1, at1472 float64
	for _, st := range stacks {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		s := Series{Name: st.name}
		for _, p := range payloads {
			mps, ev := udpSender(lineRate, p, st.perMsg, horizon)
			r.Events += ev
			g := mps * float64(p) * 8
			r.Rows = append(r.Rows, []string{st.name, itoa(p), ftoa(mps), ftoa(g / 1e9), ftoa(fabric.UDPThroughput(lineRate, p) * 8 / 1e9)})
			s.X = append(s.X, float64(p))
			s.Y = append(s.Y, g/1e9)
			if st.perMsg == 0 && p == 1 {
				at1 = mps
			}
			if st.perMsg == 0 && p == 1472 {
				at1472 = g
			}
		}
		r.Plot.Series = append(r.Plot.Series, s)
	}
	r.Metrics = []Metric{
		{Name: "FPGA messages/s at 1 B", Value: at1, Unit: "msg/s", Paper: 14.88e6, Tolerance: 0.01},
		{Name: "FPGA goodput at 1472 B", Value: at1472, Unit: "bit/s", Paper: fabric.UDPThroughput(lineRate, 1472) * 8, Tolerance: 0.01},
		{Name: "FPGA vs native messages/s at 1 B", Value: at1 / 0.32e6, Unit: "x", Paper: 14.88e6 / 0.32e6, Tolerance: 0.02},
	}
	r.Notes = append(r.Notes, "software stacks are modelled by their measured message rates (native 0.32 M, container 0.28 M, VM 0.2 M msg/s); the FPGA by fabric.UDPMessageRate")
	return r, nil
}

// hopScenario is one row of seed 003's Table 1.
type hopScenario struct {
	Name, Transfer string
	Roots, Hops    int
	NTB            int  // NTB crossings one way
	ViaRAM         bool // the counter lives in RAM: each side writes, the other reads
}

var hopScenarios = []hopScenario{
	{"Loc-P2P-SW", "peer-to-peer", 0, 1, 0, false},
	{"Loc-P2P-Root", "peer-to-peer", 1, 3, 0, false},
	{"Loc-RAM-Root", "via local RAM", 1, 3, 0, true},
	{"1L-P2P-SW", "peer-to-peer", 0, 1, 0, false},
	{"1L-P2P-IOMMU", "peer-to-peer", 1, 3, 0, false},
	{"2L-P2P-SW", "peer-to-peer", 0, 4, 1, false},
	{"2L-P2P-IOMMU", "peer-to-peer", 2, 8, 1, false},
	{"1L-RAM-SW", "via borrower's RAM", 3, 11, 1, true},
	{"1L-RAM-IOMMU", "via borrower's RAM", 3, 11, 1, true},
	{"2L-RAM-SW", "via borrower's RAM", 1, 8, 1, true},
	{"2L-RAM-IOMMU", "via borrower's RAM", 3, 11, 1, true},
}

// Hop latencies of the PCIe model: a transparent hop (switch port to port,
// cut-through) and the extra cost of passing a CPU root complex; an NTB
// crossing costs fabric.NTBCrossingLatency.
const (
	pcieHopLatency  = 20 * time.Nanosecond
	pcieRootLatency = 100 * time.Nanosecond
)

// hopGraph builds the scenario's data path as a fabric graph: a chain of
// Hops links from GPU A to GPU B (or to RAM), NTB crossings as pcie-ntb
// links, and Roots of the intermediate vertices as CPU roots (the link into
// a root carries the root's latency).
func hopGraph(s hopScenario) (*fabric.Graph, string, string) {
	var links []fabric.Link
	prev := "gpuA"
	roots, ntbs := s.Roots, s.NTB
	for i := 0; i < s.Hops; i++ {
		next := fmt.Sprintf("v%d", i)
		if i == s.Hops-1 {
			next = "gpuB"
		}
		l := fabric.Link{ID: fmt.Sprintf("l%d", i), A: prev, B: next, Kind: fabric.PCIe, Latency: pcieHopLatency, Bandwidth: 16e9}
		switch {
		case ntbs > 0 && i == s.Hops/2:
			l.Kind, l.Latency = fabric.PCIeNTB, 0 // fabric applies NTBCrossingLatency
			ntbs--
		case roots > 0 && i < s.Hops-1:
			l.Latency += pcieRootLatency
			roots--
		}
		links = append(links, l)
		prev = next
	}
	return fabric.NewGraph(links), "gpuA", "gpuB"
}

// hopRTT is the modelled ping-pong round trip of a scenario: two posted
// writes for peer-to-peer; via RAM each side writes to RAM and the other
// reads it back (a read is a round trip), so four path traversals more.
func hopRTT(s hopScenario) (oneWay, rtt time.Duration, hops int) {
	g, a, b := hopGraph(s)
	_, d, ok := g.Path(a, b, fabric.ByLatency)
	if !ok {
		return 0, 0, 0
	}
	oneWay = d.Latency
	rtt = 2 * oneWay
	if s.ViaRAM {
		rtt = 2 * (oneWay + 2*oneWay)
	}
	return oneWay, rtt, d.Hops
}

func runHopLatency(ctx context.Context, o Options) (Result, error) {
	r := Result{Header: []string{"scenario", "transfer", "roots", "hops", "ntb_crossings", "one_way_ns", "pingpong_rtt_ns"}}
	r.Plot = Plot{Title: "GPU ping-pong latency by data path (seed 003, Fig. 14 model)", YLabel: "round trip (ns)"}
	s := Series{Name: "modelled RTT"}
	rtt := map[string]time.Duration{}
	for i, sc := range hopScenarios {
		ow, rt, hops := hopRTT(sc)
		rtt[sc.Name] = rt
		r.Plot.Categories = append(r.Plot.Categories, sc.Name)
		s.X = append(s.X, float64(i))
		s.Y = append(s.Y, float64(rt.Nanoseconds()))
		r.Rows = append(r.Rows, []string{sc.Name, sc.Transfer, itoa(sc.Roots), itoa(hops), itoa(sc.NTB), itoa(int(ow.Nanoseconds())), itoa(int(rt.Nanoseconds()))})
	}
	r.Plot.Series = []Series{s}
	r.Metrics = []Metric{
		{Name: "2L-P2P-SW minus 1L-P2P-SW round trip", Value: float64((rtt["2L-P2P-SW"] - rtt["1L-P2P-SW"]).Nanoseconds()), Unit: "ns", Paper: 700, Tolerance: 0.15},
		{Name: "1L-P2P-SW vs Loc-P2P-SW (lending adds nothing)", Value: float64(rtt["1L-P2P-SW"]) / float64(rtt["Loc-P2P-SW"]), Unit: "x", Paper: 1, Tolerance: 0.01},
		{Name: "1L-P2P-IOMMU vs Loc-P2P-Root", Value: float64(rtt["1L-P2P-IOMMU"]) / float64(rtt["Loc-P2P-Root"]), Unit: "x", Paper: 1, Tolerance: 0.01},
		{Name: "NTB crossing one way", Value: float64(fabric.NTBLatency(1).Nanoseconds()), Unit: "ns", Paper: 350, Tolerance: 0.05},
	}
	r.Notes = append(r.Notes, fmt.Sprintf("model: %v per transparent hop, +%v through a CPU root, %v per NTB crossing (fabric); via-RAM round trips add a read (a round trip) per side", pcieHopLatency, pcieRootLatency, fabric.NTBCrossingLatency),
		"paper: 2L-P2P-SW is 'a little more than 700 ns' above 1L-P2P-SW; RAM-hosted counters are much slower because both GPUs must read")
	return r, nil
}
