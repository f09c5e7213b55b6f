package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
	"github.com/rialto-project/rialto/internal/sim"
)

// RelatedConfig is the related-query batching scenario on Rialto's code: a
// rule set of Rules synthetic MCT rules; the borrower's own CPU checks a
// request's queries one by one with a linear scan of the rules
// (mct.Engine.BruteForce, the conventional engine the paper's CPU side
// stands for) and stops when it has enough; the lent accelerator is an
// appliance slot running the MCT role (the compiled automaton), called with
// CallBatch, the request's related queries batched into one item: its
// queries plus the paper's 23% the early exit saves the CPU. Reps is how many times each
// timing is repeated (medians are kept).
type RelatedConfig struct {
	Rules, Reps int
}

// RelatedResult is what the scenario measured: the characterization the
// model needs (seconds per query in the scan, a call's fixed and per-query
// cost), the crossover the model predicts from it, and the crossover
// measured end to end (both: the fewest queries per request for which the
// call is faster, the measured one on a grid of request sizes; 0: none up
// to Max).
type RelatedResult struct {
	CPUFixed, CPU, Fixed, PerQuery float64
	Predicted, Measured            float64
	Max                            int
}

const defaultRelatedReps = 31

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// RunRelated runs the scenario on loopback.
func RunRelated(ctx context.Context, cfg RelatedConfig) (RelatedResult, error) {
	if cfg.Rules <= 0 {
		cfg.Rules = 500
	}
	if cfg.Reps <= 0 {
		cfg.Reps = defaultRelatedReps
	}
	var res RelatedResult
	r := rand.New(rand.NewPCG(7, 11))
	rs := mct.Generate(r, cfg.Rules)
	eng, err := mct.Compile(rs)
	if err != nil {
		return res, err
	}
	const pool = 8192
	qs, err := eng.EncodeAll(mct.GenerateQueries(r, pool))
	if err != nil {
		return res, err
	}
	query := func(i int) []byte { return qs[(i%pool)*mct.QuerySize : (i%pool+1)*mct.QuerySize] }
	ruleJSON, err := json.Marshal(rs)
	if err != nil {
		return res, err
	}
	a, err := appliance.New(appliance.Config{Slots: 1, SlotMemory: 1 << 20, Workers: 1})
	if err != nil {
		return res, err
	}
	actx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- a.Run(actx) }()
	defer func() { stop(); <-ran }()
	if err := a.Load(ctx, 0, roles.Spec{Name: "mct", Config: ruleJSON}); err != nil {
		return res, fmt.Errorf("lab: load the MCT role: %w", err)
	}
	cred := []byte(randomName())
	if err := a.SetCredential(0, cred); err != nil {
		return res, err
	}
	addr, err := a.Addr(0)
	if err != nil {
		return res, err
	}
	conn, err := accel.Dial(ctx, addr, cred)
	if err != nil {
		return res, fmt.Errorf("lab: dial the slot: %w", err)
	}
	defer conn.Close()

	next := 0
	cpuTime := func(n int) float64 {
		t0 := time.Now()
		for i := 0; i < n; i++ {
			eng.BruteForce(query(next))
			next++
		}
		return time.Since(t0).Seconds()
	}
	callTime := func(b int) (float64, error) {
		in := make([]byte, 0, b*mct.QuerySize)
		for i := 0; i < b; i++ {
			in = append(in, query(next)...)
			next++
		}
		t0 := time.Now()
		if _, err := conn.CallBatch(ctx, "match", [][]byte{in}); err != nil {
			return 0, err
		}
		return time.Since(t0).Seconds(), nil
	}
	extra := sim.RelatedExtra
	batch := func(n int) int { return int(math.Ceil(float64(n) * (1 + extra))) }
	// Every request size of the grid is timed once per round, both ways,
	// round after round, so that the machine's load, which moves in
	// seconds, touches every size alike; medians over the rounds.
	grid := []int{1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 64, 96, 128}
	cpu := make([][]float64, len(grid))
	call := make([][]float64, len(grid))
	for round := -2; round < cfg.Reps; round++ { // two rounds to warm up
		for i, n := range grid {
			c := cpuTime(n)
			a, err := callTime(batch(n))
			if err != nil {
				return res, err
			}
			if round >= 0 {
				cpu[i], call[i] = append(cpu[i], c), append(call[i], a)
			}
		}
	}
	at := func(xs [][]float64, n int) float64 {
		for i, g := range grid {
			if g == n {
				return median(xs[i])
			}
		}
		panic("lab: not on the grid")
	}
	// Characterize from the large requests (costs per query: 32 and 128
	// queries) and the smallest (what a request costs beyond them); a scan
	// right after a call finds colder caches, a call right after a scan a
	// sleeping slot, and both are in these figures.
	res.CPU = (at(cpu, 128) - at(cpu, 32)) / 96
	res.CPUFixed = math.Max(0, at(cpu, 1)-res.CPU)
	res.PerQuery = (at(call, 128) - at(call, 32)) / float64(batch(128)-batch(32))
	res.Fixed = math.Max(0, at(call, 1)-float64(batch(1))*res.PerQuery)
	res.Max = grid[len(grid)-1]
	res.Predicted = float64(sim.RelatedModel{CPUFixed: res.CPUFixed, CPU: res.CPU, Extra: extra, Call: sim.LinearCall(res.Fixed, res.PerQuery)}.Crossover(res.Max))
	// Measured: the smallest request size of the grid from which the call
	// is faster at every larger size too.
	for i := len(grid) - 1; i >= 0; i-- {
		if median(call[i]) >= median(cpu[i]) {
			break
		}
		res.Measured = float64(grid[i])
	}
	return res, nil
}

func init() {
	counterparts["erbium-related"] = func(ctx context.Context, res *sim.Result) error {
		m, err := RunRelated(ctx, RelatedConfig{})
		if err != nil {
			return err
		}
		for i := range res.Metrics {
			if res.Metrics[i].Name != "crossover, Rialto's MCT role vs the local rule scan" {
				continue
			}
			// The model's inputs are now measured: the figure becomes a
			// prediction from them, compared with the crossover measured
			// end to end.
			res.Metrics[i].Kind = sim.Prediction
			res.Metrics[i].Unit = "queries"
			res.Metrics[i].Value = m.Predicted
			res.Metrics[i].Note = fmt.Sprintf("predicted from %.2f µs per query in the scan (+%.1f µs per request), %.2f µs in the role and %.0f µs per call (all measured); the call checks 23%% more queries", m.CPU*1e6, m.CPUFixed*1e6, m.PerQuery*1e6, m.Fixed*1e6)
			res.Metrics[i].Real = &sim.Real{Value: m.Measured, Tolerance: math.Max(0.25, 1/m.Measured), Note: fmt.Sprintf("measured end to end on a grid of request sizes, medians of %d rounds", defaultRelatedReps)}
			return nil
		}
		return errors.New("lab: erbium-related: the experiment's metrics changed")
	}
}
