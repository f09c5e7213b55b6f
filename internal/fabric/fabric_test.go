package fabric

import (
	"math"
	"testing"
	"time"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*math.Max(1, math.Abs(b)) }

func TestUDPLineRate(t *testing.T) {
	// Seed 004: 14.88 M msg/s at 1 B payload on 10 GbE.
	if got := UDPMessageRate(10e9, 1); !near(got, 14.88e6, 0.001) {
		t.Fatalf("1 B on 10 GbE: %.0f msg/s, want 14.88 M", got)
	}
	// Formula: line rate × payload / (payload + 66).
	if got, want := UDPThroughput(10e9, 1472), 1.25e9*1472/1538; !near(got, want, 1e-12) {
		t.Fatalf("1472 B: %v want %v", got, want)
	}
	if got := UDPMessageRate(10e9, 1472); !near(got, 1.25e9/1538, 1e-12) {
		t.Fatalf("1472 B msg rate %v", got)
	}
	if UDPThroughput(10e9, 0) != 0 || UDPMessageRate(10e9, -1) != 0 {
		t.Fatal("non-positive payloads")
	}
}

func TestNTBLatency(t *testing.T) {
	if NTBLatency(1) != 350*time.Nanosecond || NTBLatency(2) != 700*time.Nanosecond || NTBLatency(0) != 0 {
		t.Fatal("NTB crossing latency")
	}
	// A pcie-ntb link with no declared latency gets the rule.
	g := NewGraph([]Link{{A: "a", B: "b", Kind: PCIeNTB}, {A: "b", B: "c", Kind: PCIeNTB}})
	_, d, ok := g.Path("a", "c", ByLatency)
	if !ok || d.Latency != 700*time.Nanosecond || d.Hops != 2 {
		t.Fatalf("path a-c: %+v %v", d, ok)
	}
}

func TestRootReadSplit(t *testing.T) {
	// Gen3 x8 ≈ 7.9 GB/s, 32 tags, 2 µs read round trip through the root.
	bw := 7.9e9
	direct := DirectReadBandwidth(bw, 32, 2*time.Microsecond)
	root := RootReadBandwidth(bw, 32, 2*time.Microsecond)
	if !near(root, direct/4, 1e-9) {
		t.Fatalf("tag-limited root read %v, want a quarter of %v", root, direct)
	}
	if root > 0.5*direct {
		t.Fatal("reads through a CPU root must lose most bandwidth")
	}
	// Unlimited window: only TLP overhead differs.
	if got := RootReadBandwidth(bw, 0, 0); !near(got, bw*64/88, 1e-12) {
		t.Fatalf("wire-limited root read %v", got)
	}
}

func TestShortestPaths(t *testing.T) {
	// a–b–d is 2 hops but slow; a–c–e–d is 3 hops and fast.
	links := []Link{
		{ID: "ab", A: "a", B: "b", Latency: 10 * time.Microsecond},
		{ID: "bd", A: "b", B: "d", Latency: 10 * time.Microsecond},
		{ID: "ac", A: "a", B: "c", Latency: time.Microsecond},
		{ID: "ce", A: "c", B: "e", Latency: time.Microsecond},
		{ID: "ed", A: "e", B: "d", Latency: time.Microsecond},
		{ID: "ax", A: "a", B: "x", Down: true},
	}
	g := NewGraph(links)
	p, d, ok := g.Path("a", "d", ByHops)
	if !ok || d.Hops != 2 || len(p) != 2 || g.Links()[p[0]].ID != "ab" {
		t.Fatalf("by hops: %v %+v", p, d)
	}
	p, d, ok = g.Path("a", "d", ByLatency)
	if !ok || d.Hops != 3 || d.Latency != 3*time.Microsecond || g.Links()[p[0]].ID != "ac" {
		t.Fatalf("by latency: %v %+v", p, d)
	}
	if _, _, ok := g.Path("a", "x", ByHops); ok {
		t.Fatal("down link used")
	}
}

func TestMaxMin(t *testing.T) {
	inf := math.Inf(1)
	cases := []struct {
		name  string
		caps  []float64
		flows []Flow
		want  []float64
	}{
		{"equal split", []float64{10}, []Flow{{Uses: []Use{{0, 1}}}, {Uses: []Use{{0, 1}}}}, []float64{5, 5}},
		{"demand cap frees share", []float64{10}, []Flow{{Demand: 2, Uses: []Use{{0, 1}}}, {Uses: []Use{{0, 1}}}}, []float64{2, 8}},
		{"weighted", []float64{9}, []Flow{{Weight: 2, Uses: []Use{{0, 1}}}, {Uses: []Use{{0, 1}}}}, []float64{6, 3}},
		{"classic parking lot", []float64{10, 10}, []Flow{
			{Uses: []Use{{0, 1}, {1, 1}}}, {Uses: []Use{{0, 1}}}, {Uses: []Use{{1, 1}}}}, []float64{5, 5, 5}},
		{"bottleneck elsewhere", []float64{10, 4}, []Flow{
			{Uses: []Use{{0, 1}, {1, 1}}}, {Uses: []Use{{0, 1}}}}, []float64{4, 6}},
		{"striped coef", []float64{2, 2}, []Flow{
			{Uses: []Use{{0, .5}, {1, .5}}}, {Uses: []Use{{0, 1}}}}, []float64{4.0 / 3, 4.0 / 3}},
		{"unconstrained", []float64{inf}, []Flow{{Uses: []Use{{0, 1}}}, {Demand: 3}}, []float64{inf, 3}},
		{"zero capacity", []float64{0}, []Flow{{Uses: []Use{{0, 1}}}}, []float64{0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := MaxMin(c.caps, c.flows)
			for i := range c.want {
				if !(got[i] == c.want[i] || near(got[i], c.want[i], 1e-9)) {
					t.Fatalf("rates %v, want %v", got, c.want)
				}
			}
		})
	}
}
