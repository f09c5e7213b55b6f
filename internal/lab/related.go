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
// CallBatch, one item per query, for the request's queries plus the
// paper's 23% the early exit saves the CPU. Reps is how many times each
// timing is repeated (medians are kept).
type RelatedConfig struct {
	Rules, Reps int
}

// RelatedResult is what the scenario measured: the characterization the
// model needs (seconds per query in the scan, a call's fixed and per-query
// cost), the crossover the model predicts from it, and the crossover
// measured end to end (both: the fewest queries per request for which the
// call is faster; 0: none up to Max).
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
		ins := make([][]byte, b)
		for i := range ins {
			ins[i] = query(next)
			next++
		}
		t0 := time.Now()
		if _, err := conn.CallBatch(ctx, "match", ins); err != nil {
			return 0, err
		}
		return time.Since(t0).Seconds(), nil
	}
	extra := sim.RelatedExtra
	batch := func(n int) int { return int(math.Ceil(float64(n) * (1 + extra))) }
	// One round of timings at n queries: the scan of n and the call of
	// batch(n), interleaved so that the machine's load touches both alike.
	measure := func(n int) (cpu, call float64, err error) {
		var cs, as []float64
		for k := 0; k < cfg.Reps; k++ {
			cs = append(cs, cpuTime(n))
			t, err := callTime(batch(n))
			if err != nil {
				return 0, 0, err
			}
			as = append(as, t)
		}
		return median(cs), median(as), nil
	}
	// Warm up both paths.
	if _, _, err := measure(64); err != nil {
		return res, err
	}
	// Characterize, under the same interleaving as the measurement: the
	// scan's and the call's cost as fixed plus per query, from requests of
	// 8 and 128 queries.
	c8, a8, err := measure(8)
	if err != nil {
		return res, err
	}
	c128, a128, err := measure(128)
	if err != nil {
		return res, err
	}
	res.CPU = (c128 - c8) / 120
	res.CPUFixed = math.Max(0, c8-8*res.CPU)
	res.PerQuery = (a128 - a8) / float64(batch(128)-batch(8))
	res.Fixed = a8 - float64(batch(8))*res.PerQuery
	// The model's crossover: the first n at which the call is faster.
	res.Max = 4096
	if p := sim.RelatedCrossoverLinear(res.CPU, extra, res.Fixed, res.PerQuery); p > 0 {
		res.Max = max(64, int(4*p))
	}
	res.Predicted = float64(sim.RelatedModel{CPUFixed: res.CPUFixed, CPU: res.CPU, Extra: extra, Call: sim.LinearCall(res.Fixed, res.PerQuery)}.Crossover(res.Max))

	// Measure: walk n up a grid until the call wins, then bisect between
	// the last n where the scan won and the first where the call did.
	wins := func(n int) (bool, error) {
		c, a, err := measure(n)
		return a < c, err
	}
	lo, hi := 0, 0
	for n := 1; n <= res.Max; n = max(n+1, n*5/4) {
		w, err := wins(n)
		if err != nil {
			return res, err
		}
		if w {
			hi = n
			break
		}
		lo = n
	}
	if hi == 0 {
		return res, nil // no crossover up to Max
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		w, err := wins(mid)
		if err != nil {
			return res, err
		}
		if w {
			hi = mid
		} else {
			lo = mid
		}
	}
	res.Measured = float64(hi)
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
			res.Metrics[i].Real = &sim.Real{Value: m.Measured, Tolerance: math.Max(0.25, 1/m.Measured), Note: fmt.Sprintf("measured end to end, medians of %d; tolerance 25%% or one query", defaultRelatedReps)}
			return nil
		}
		return errors.New("lab: erbium-related: the experiment's metrics changed")
	}
}
