package sim

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// Experiments whose scenario package lab also runs on Rialto's own code
// (`rialto sim run --real`): the simulator predicts, lab measures the same
// scenario, and the table puts both side by side.

func init() {
	register("hop-relay", after("lending", "Table 1 and Fig. 14"), "4 KiB reads on a block (NBD) lease through 0–3 relays that each delay every byte (a stand-in for the paper's NTB hops): round trip added per hop", runHopRelay)
	register("qpair-credits", after("venice", "Fig. 18"), "a memory queue pair's link utilisation with its credits returned over a fast path vs a slow one", runQPairCredits)
}

// HopRelaySpec is the hop-relay scenario: a borrower reads from a lender
// through up to MaxHops relays in series, each delaying every byte by Delay
// in each direction.
type HopRelaySpec struct {
	Delay   time.Duration
	MaxHops int
}

// DefaultHopRelay: 2 ms per relay and direction (large against the timer
// and scheduling noise of a loaded 2-vCPU machine), up to 3 relays.
var DefaultHopRelay = HopRelaySpec{Delay: 2 * time.Millisecond, MaxHops: 3}

// HopRelayAdded is the round trip h relays add to a request: the fabric
// model's path latency over a chain of h links of latency spec.Delay, both
// ways.
func HopRelayAdded(spec HopRelaySpec, h int) time.Duration {
	if h == 0 {
		return 0
	}
	var links []fabric.Link
	prev := "borrower"
	for i := 0; i < h; i++ {
		next := fmt.Sprintf("relay%d", i)
		if i == h-1 {
			next = "lender"
		}
		links = append(links, fabric.Link{ID: fmt.Sprintf("hop%d", i), A: prev, B: next, Kind: fabric.Ethernet, Latency: spec.Delay, Bandwidth: 1e9})
		prev = next
	}
	g := fabric.NewGraph(links)
	_, d, ok := g.Path("borrower", "lender", fabric.ByLatency)
	if !ok {
		return 0
	}
	return 2 * d.Latency
}

func runHopRelay(ctx context.Context, o Options) (Result, error) {
	spec := DefaultHopRelay
	r := Result{Header: []string{"relays", "added_round_trip_us"}}
	r.Plot = Plot{Title: "Round trip added by relay hops (block lease, 4 KiB reads)", XLabel: "relays", YLabel: "added round trip (µs)"}
	s := Series{Name: "simulated"}
	for h := 0; h <= spec.MaxHops; h++ {
		a := HopRelayAdded(spec, h)
		r.Rows = append(r.Rows, []string{itoa(h), ftoa(float64(a.Microseconds()))})
		s.X, s.Y = append(s.X, float64(h)), append(s.Y, float64(a.Microseconds()))
	}
	r.Plot.Series = []Series{s}
	per := float64(HopRelayAdded(spec, spec.MaxHops).Microseconds()) / float64(spec.MaxHops)
	r.Metrics = []Metric{
		{Name: "round trip added per relay hop", Value: per, Unit: "µs", Kind: Prediction,
			Note: "the Device Lending paper's finding that latency follows the path (each hop adds its crossing both ways), on Rialto's block data plane"},
		{Name: fmt.Sprintf("round trip added by %d relay hops", spec.MaxHops), Value: float64(HopRelayAdded(spec, spec.MaxHops).Microseconds()), Unit: "µs", Kind: Prediction},
	}
	r.Notes = append(r.Notes, fmt.Sprintf("each relay delays every byte by %v each way; the model adds the hops' latencies along the fabric path and nothing else (no cost of its own for a relay); the real counterpart (`--real`) measures median 4 KiB read round trips on an NBD export through 0–%d relays on loopback", spec.Delay, spec.MaxHops))
	return r, ctx.Err()
}

// QPairSpec is the queue-pair scenario: a client posts OpBytes writes on a
// queue pair whose donor grants Window credits; the writes cross a link of
// Rate bytes/s with one-way Delay; the donor returns credits in batches of
// max(Window/4, 1) (or when it has nothing left to do) over a path of
// one-way CreditDelay. Service is what the two ends themselves add per
// write between its arrival and the next post it allows (handing the
// write, the credit and the wake-up between threads); the nominal scenario
// has none.
type QPairSpec struct {
	OpBytes     int
	Window      int
	Rate        float64
	Delay       time.Duration
	CreditDelay time.Duration
	Service     time.Duration
	Ops         int
}

// DefaultQPair: 16 KiB writes, 2 credits, an 8 MB/s link with 2 ms each way.
var DefaultQPair = QPairSpec{OpBytes: 16 << 10, Window: 2, Rate: 8e6, Delay: 2 * time.Millisecond, CreditDelay: 2 * time.Millisecond, Ops: 400}

// SlowCredits is the extra one-way delay of the slow credit path: credits
// travelling behind data, as on Venice's QPair channel before its credits
// moved to the low-latency channel.
const SlowCredits = 6 * time.Millisecond

// QPairSteady is the share of the link's rate writes used in steady state,
// from the times at which they arrived (or completed: a constant offset
// does not matter): Window writes per median time between a write and the
// Window-th after it, past the first tenth. The median, not the mean: on a
// loaded machine a stalled thread stretches a few windows by milliseconds,
// which is the machine's, not the protocol's.
func QPairSteady(spec QPairSpec, at []float64) float64 {
	w := max(spec.Window, 1)
	var d []float64
	for i := len(at) / 10; i+w < len(at); i++ {
		d = append(d, at[i+w]-at[i])
	}
	if len(d) == 0 {
		return 0
	}
	sort.Float64s(d)
	cycle := d[len(d)/2]
	if cycle <= 0 {
		return 0
	}
	return math.Min(1, float64(w*spec.OpBytes)/cycle/spec.Rate)
}

// QPairUtilisation simulates the queue pair and returns the share of the
// link's rate the writes used in steady state (QPairSteady over the
// writes' arrival times at the donor) and the events run.
func QPairUtilisation(spec QPairSpec) (float64, uint64) {
	var e Engine
	credits := spec.Window
	batch := max(spec.Window/4, 1)
	var linkFree Time // the link serialises writes in order
	granted, reported := 0, 0
	posted, arrived := 0, 0
	at := make([]float64, 0, spec.Ops)
	ser := float64(spec.OpBytes) / spec.Rate
	var post func()
	post = func() {
		for credits > 0 && posted < spec.Ops {
			credits--
			posted++
			start := math.Max(e.Now(), linkFree)
			linkFree = start + ser
			e.At(linkFree+spec.Delay.Seconds(), func() {
				arrived++
				at = append(at, e.Now())
				granted++
				// The donor reports a batch, or whatever it has when no
				// further write is on its way (it went idle).
				if granted-reported >= batch || arrived == posted {
					n := granted - reported
					reported = granted
					e.After((spec.Service + spec.CreditDelay).Seconds(), func() {
						credits += n
						post()
					})
				}
			})
		}
	}
	e.At(0, post)
	e.Run(0)
	return QPairSteady(spec, at), e.Events()
}

func runQPairCredits(ctx context.Context, o Options) (Result, error) {
	spec := DefaultQPair
	spec.Ops = int(float64(spec.Ops) * o.scale())
	slow := spec
	slow.CreditDelay += SlowCredits
	fast, ev1 := QPairUtilisation(spec)
	sl, ev2 := QPairUtilisation(slow)
	r := Result{Events: ev1 + ev2, Header: []string{"credit_path", "credit_delay_ms", "utilisation"}}
	r.Rows = [][]string{{"fast", ftoa(float64(spec.CreditDelay.Microseconds()) / 1e3), ftoa(fast)}, {"slow", ftoa(float64(slow.CreditDelay.Microseconds()) / 1e3), ftoa(sl)}}
	r.Plot = Plot{Title: "Queue-pair utilisation by credit path", YLabel: "link utilisation", Categories: []string{"slow credits", "fast credits"},
		Series: []Series{{Name: "simulated", X: []float64{0, 1}, Y: []float64{sl, fast}}}}
	r.Metrics = []Metric{
		{Name: "utilisation, credits on the fast path", Value: fast, Kind: Prediction},
		{Name: "utilisation, credits delayed", Value: sl, Kind: Prediction},
		{Name: "fast credits raise utilisation (1 = yes)", Value: b2f(fast > 1.1*sl), Kind: Prediction, Figure: "venice/fig18-qpair",
			Note: fmt.Sprintf("×%.2f here; the paper's ×1.82 (28%% → 51%%) depends on its packet sizes and latencies, not ours", fast/sl)},
	}
	if o.Sensitivity {
		in := []struct {
			name string
			set  func(s *QPairSpec, f float64)
			nom  float64
		}{
			{"link delay", func(s *QPairSpec, f float64) { s.Delay = time.Duration(f * float64(s.Delay)) }, spec.Delay.Seconds()},
			{"link rate", func(s *QPairSpec, f float64) { s.Rate *= f }, spec.Rate},
			{"slow path's extra delay", func(s *QPairSpec, f float64) {}, SlowCredits.Seconds()},
		}
		for _, x := range in {
			r.Metrics[2].Sensitivity = append(r.Metrics[2].Sensitivity, sensitize(x.name, x.nom, func(f float64) string {
				a, b := spec, spec
				x.set(&a, f)
				x.set(&b, f)
				extra := SlowCredits
				if x.name == "slow path's extra delay" {
					extra = time.Duration(f * float64(extra))
				}
				b.CreditDelay += extra
				u1, _ := QPairUtilisation(a)
				u2, _ := QPairUtilisation(b)
				return fmt.Sprint(u1 > 1.1*u2)
			}))
		}
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%d B writes, %d credits (credits return in batches of %d), link %.0f MB/s with %v each way; credits return after %v (fast) or %v (slow); the real counterpart (`--real`) runs Rialto's memory queue pair through relays that shape the data connection and delay the control connection, which carries the credits",
		spec.OpBytes, spec.Window, max(spec.Window/4, 1), spec.Rate/1e6, spec.Delay, spec.CreditDelay, slow.CreditDelay))
	return r, ctx.Err()
}
