package sim

import (
	"context"
	"fmt"
)

func init() {
	register("gpu-training", follows("lending", "§7.5"), "VGG19-like training on 2 GPUs + NVMe, local vs borrowed over NTB (direct peer-to-peer) vs borrowed with reads through a CPU root", runTraining)
}

func runTraining(ctx context.Context, o Options) (Result, error) {
	spec := DefaultTraining
	spec.Steps = int(float64(spec.Steps) * o.scale())
	paths := []TrainingPath{
		{Name: "local", Remote: false},
		{Name: "borrowed, direct P2P", Remote: true},
		{Name: "borrowed, via CPU root (IOMMU)", Remote: true, ThroughRoot: true},
	}
	r := Result{Calibrations: []string{"fabric.NTBCrossingLatency"}, Header: []string{"placement", "seconds", "vs_local"}}
	r.Plot = Plot{Title: "2-GPU training step time", YLabel: "run time / local", Categories: []string{}}
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
		{Name: "borrowed (direct P2P) vs local", Value: times["borrowed, direct P2P"], Unit: "x", Kind: Prediction, Figure: "lending/vgg19"},
		{Name: "borrowed via CPU root vs local", Value: times["borrowed, via CPU root (IOMMU)"], Unit: "x", Kind: Prediction, Note: "the paper shows the increase only as a plot"},
		{Name: "reads through the lender's root slow training (1 = yes)", Value: b2f(times["borrowed, via CPU root (IOMMU)"] > 1.01), Kind: Prediction, Figure: "lending/vgg19-iommu"},
	}
	if o.Sensitivity {
		in := []struct {
			name string
			set  func(s *TrainingSpec, f float64)
			nom  float64
		}{
			{"compute per step", func(s *TrainingSpec, f float64) { s.Compute *= f }, spec.Compute},
			{"gradient bytes", func(s *TrainingSpec, f float64) { s.Gradients *= f }, spec.Gradients},
			{"batch bytes", func(s *TrainingSpec, f float64) { s.Batch *= f }, spec.Batch},
		}
		outcomes := []func(s TrainingSpec) string{
			func(s TrainingSpec) string {
				l, _ := RunTraining(s, paths[0])
				b, _ := RunTraining(s, paths[1])
				return fmt.Sprint(b/l <= 1+fig0("lending/vgg19"))
			},
			nil,
			func(s TrainingSpec) string {
				l, _ := RunTraining(s, paths[0])
				b, _ := RunTraining(s, paths[2])
				return fmt.Sprint(b/l > 1.01)
			},
		}
		for i, oc := range outcomes {
			if oc == nil {
				continue
			}
			for _, x := range in {
				r.Metrics[i].Sensitivity = append(r.Metrics[i].Sensitivity, sensitize(x.name, x.nom, func(f float64) string {
					s := spec
					s.Steps = 10
					x.set(&s, f)
					return oc(s)
				}))
			}
		}
	}
	r.Notes = append(r.Notes, "peer reads use fabric.DirectReadBandwidth / RootReadBandwidth (256 B vs 64 B read requests, 32 outstanding); the job's sizes (batch, compute, gradients) are assumptions, not tuned to a figure")
	return r, ctx.Err()
}
