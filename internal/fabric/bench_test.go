package fabric

import (
	"math/rand"
	"testing"
)

// BenchmarkMaxMin: 20,000 flows over 5,000 resources (each flow crossing a
// device and three links, as a lease does in a two-level fabric).
func BenchmarkMaxMin(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	const nres, nflows = 5000, 20000
	capacity := make([]float64, nres)
	for i := range capacity {
		capacity[i] = float64(1+rng.Intn(20)) * 1e9
	}
	flows := make([]Flow, nflows)
	for i := range flows {
		f := &flows[i]
		if rng.Intn(3) > 0 {
			f.Demand = float64(1+rng.Intn(10)) * 1e8
		}
		for k := 0; k < 4; k++ {
			f.Uses = append(f.Uses, Use{Resource: rng.Intn(nres), Coef: 1})
		}
	}
	var s Solver
	rates := make([]float64, nflows)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rates = s.Solve(capacity, flows, rates)
	}
	b.ReportMetric(float64(nflows)*float64(b.N)/b.Elapsed().Seconds(), "flows/s")
}

// TestMaxMinProperties checks random instances: no resource over capacity,
// no flow above its demand, and every flow is either at its demand or
// crosses a saturated resource on which no other flow has a higher weighted
// rate (the max-min bottleneck condition).
func TestMaxMinProperties(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	var s Solver
	for round := 0; round < 300; round++ {
		nres, nflows := 1+rng.Intn(8), 1+rng.Intn(12)
		capacity := make([]float64, nres)
		for i := range capacity {
			capacity[i] = float64(1 + rng.Intn(10))
		}
		flows := make([]Flow, nflows)
		for i := range flows {
			f := &flows[i]
			if rng.Intn(2) == 0 {
				f.Demand = float64(rng.Intn(6)) + 0.5
			}
			f.Weight = float64(1 + rng.Intn(3))
			for k := 1 + rng.Intn(3); k > 0; k-- {
				f.Uses = append(f.Uses, Use{Resource: rng.Intn(nres), Coef: []float64{1, 0.5, 0.25}[rng.Intn(3)]})
			}
		}
		rates := s.Solve(capacity, flows, nil)
		load := make([]float64, nres)
		for i, f := range flows {
			if f.Demand > 0 && rates[i] > f.Demand*(1+1e-9) {
				t.Fatalf("round %d: flow %d above demand", round, i)
			}
			for _, u := range f.Uses {
				load[u.Resource] += u.Coef * rates[i]
			}
		}
		for r := range load {
			if load[r] > capacity[r]*(1+1e-9) {
				t.Fatalf("round %d: resource %d over capacity: %v > %v", round, r, load[r], capacity[r])
			}
		}
		for i, f := range flows {
			if f.Demand > 0 && rates[i] >= f.Demand*(1-1e-9) {
				continue
			}
			ok := false
			for _, u := range f.Uses {
				if load[u.Resource] < capacity[u.Resource]*(1-1e-9) {
					continue
				}
				top := true
				for j, g := range flows {
					for _, v := range g.Uses {
						if v.Resource == u.Resource && rates[j]/weight(&g) > rates[i]/weight(&f)*(1+1e-9) {
							top = false
						}
					}
				}
				if top {
					ok = true
				}
			}
			if !ok {
				t.Fatalf("round %d: flow %d (rate %v) has no bottleneck", round, i, rates[i])
			}
		}
	}
}
