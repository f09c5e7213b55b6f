package sim

import "context"

func init() {
	register("gpu-training", "seed 003: VGG19-like training on 2 GPUs + NVMe, local vs borrowed over NTB (direct peer-to-peer) vs borrowed with reads through a CPU root", runTraining)
}

func runTraining(ctx context.Context, o Options) (Result, error) {
	spec := DefaultTraining
	spec.Steps = int(float64(spec.Steps) * o.scale())
	paths := []TrainingPath{
		{Name: "local", Remote: false},
		{Name: "borrowed, direct P2P", Remote: true},
		{Name: "borrowed, via CPU root (IOMMU)", Remote: true, ThroughRoot: true},
	}
	r := Result{Header: []string{"placement", "seconds", "vs_local"}}
	r.Plot = Plot{Title: "2-GPU training step time (seed 003)", YLabel: "run time / local", Categories: []string{}}
	s := Series{Name: "run time / local"}
	var local Time
	times := map[string]float64{}
	for i, p := range paths {
		t, ev := RunTraining(spec, p)
		r.Events += ev
		if i == 0 {
			local = t
		}
		times[p.Name] = t / local
		r.Rows = append(r.Rows, []string{p.Name, ftoa(t), ftoa(t / local)})
		r.Plot.Categories = append(r.Plot.Categories, p.Name)
		s.X, s.Y = append(s.X, float64(i)), append(s.Y, t/local)
	}
	r.Plot.Series = []Series{s}
	r.Metrics = []Metric{
		{Name: "borrowed (direct P2P) vs local", Value: times["borrowed, direct P2P"], Unit: "x", Paper: 1, Tolerance: 0.02},
		{Name: "borrowed via CPU root vs local", Value: times["borrowed, via CPU root (IOMMU)"], Unit: "x"},
	}
	r.Notes = append(r.Notes, "peer reads use fabric.DirectReadBandwidth / RootReadBandwidth (256 B vs 64 B read requests, 32 outstanding); seed 003: remote GPUs and NVMe run as fast as local when paths are direct")
	return r, ctx.Err()
}
