package sim

import (
	"context"
	"fmt"
	"io/fs"
	"path"
)

func init() {
	register("gpu-openb", own, "policy comparison on the Alibaba openb GPU trace (1,523 nodes, 8,152 pods): whole-device allocation (Nomad, Slurm GRES) vs Rialto share/compose/dedicate — utilisation, stranded capacity, deadline misses, slowdown", runGPUOpenb)
}

const openbDir = "alibaba-gpu-v2023"

// LoadOpenb reads the openb node list and a pod list from the trace
// directory traces.
func LoadOpenb(traces fs.FS, podList string) ([]TraceNode, []TracePod, error) {
	if traces == nil {
		return nil, nil, ErrNoTraces
	}
	if podList == "" {
		podList = "openb_pod_list_default.csv"
	}
	nf, err := traces.Open(path.Join(openbDir, "openb_node_list_all_node.csv"))
	if err != nil {
		return nil, nil, fmt.Errorf("sim: open node list: %w", err)
	}
	defer nf.Close()
	nodes, err := ReadTraceNodes(nf)
	if err != nil {
		return nil, nil, err
	}
	pf, err := traces.Open(path.Join(openbDir, podList))
	if err != nil {
		return nil, nil, fmt.Errorf("sim: open pod list: %w", err)
	}
	defer pf.Close()
	pods, err := ReadTracePods(pf)
	if err != nil {
		return nil, nil, err
	}
	return nodes, pods, nil
}

func runGPUOpenb(ctx context.Context, o Options) (Result, error) {
	nodes, pods, err := LoadOpenb(o.Traces, o.PodList)
	if err != nil {
		return Result{}, err
	}
	r := Result{Header: []string{"policy", "window_s", "pods", "placed", "never", "deadline_missed", "remote_pods", "gpu_utilisation", "gpu_allocated", "gpu_stranded", "mean_slowdown", "p95_slowdown", "place_calls"}}
	r.Plot = Plot{Title: "openb trace: whole-device vs Rialto", YLabel: "fraction", Categories: []string{"GPU utilisation", "GPU allocated", "stranded", "deadline misses"}}
	windows := []float64{3600}
	if o.scale() > 1 {
		windows = []float64{3600, 4 * 3600, 12 * 3600}
	}
	if o.Sample > 1 {
		nodes, pods = SampleOpenb(nodes, pods, o.Sample)
	}
	out := map[string]GPUReplayResult{}
	for _, pol := range []string{PolicyWholeDevice, PolicyRialto} {
		s := Series{Name: pol}
		for _, win := range windows {
			if err := ctx.Err(); err != nil {
				return r, err
			}
			cfg := DefaultGPUReplay
			cfg.Policy, cfg.Window, cfg.Seed = pol, win, o.Seed
			res, err := ReplayGPU(ctx, nodes, pods, cfg)
			if err != nil {
				return r, err
			}
			r.Events += res.Events
			miss := float64(res.Missed) / float64(res.Pods)
			r.Rows = append(r.Rows, []string{pol, ftoa(win), itoa(res.Pods), itoa(res.Placed), itoa(res.Never), itoa(res.Missed), itoa(res.Remote),
				ftoa(res.Utilisation), ftoa(res.Allocated), ftoa(res.Stranded), ftoa(res.MeanSlowdown), ftoa(res.P95Slowdown), itoa(res.PlaceCalls)})
			if win == windows[0] {
				out[pol] = res
				s.X = []float64{0, 1, 2, 3}
				s.Y = []float64{res.Utilisation, res.Allocated, res.Stranded, miss}
			}
		}
		r.Plot.Series = append(r.Plot.Series, s)
	}
	for _, pol := range []string{PolicyWholeDevice, PolicyRialto} {
		res := out[pol]
		r.Metrics = append(r.Metrics,
			Metric{Name: pol + ": GPU utilisation", Value: res.Utilisation, Kind: Prediction},
			Metric{Name: pol + ": GPU allocated", Value: res.Allocated, Kind: Prediction},
			Metric{Name: pol + ": GPU stranded", Value: res.Stranded, Kind: Prediction},
			Metric{Name: pol + ": deadline misses", Value: float64(res.Missed) / float64(res.Pods), Kind: Prediction},
			Metric{Name: pol + ": mean completion slowdown", Value: res.MeanSlowdown, Unit: "x", Kind: Prediction},
			Metric{Name: pol + ": p95 completion slowdown", Value: res.P95Slowdown, Unit: "x", Kind: Prediction})
	}
	c := DefaultGPUReplay
	r.Notes = append(r.Notes,
		fmt.Sprintf("%d nodes, %d pods; arrivals in trace order compressed into the window; durations clamped to [%.0f h, %.0f h] so the trace's pods overlap (they ask for %.0f%% of the GPUs, %.0f%% in whole GPUs); utilisation etc. averaged over window + %.0f h; deadline = arrival + %g × duration + %.0f s; racks of %d nodes on PCIe NTB; remote GPUs ×%.2f", len(nodes), len(pods), c.MinDuration/3600, c.MaxDuration/3600, 100*out[PolicyRialto].Demand, 100*out[PolicyRialto].WholeDemand, c.MinDuration/3600, c.DeadlineFactor, c.DeadlineSlack, c.RackSize, c.RemoteSlowdown),
		"whole-device: a pod holds whole GPUs of its own node (a 0.2-GPU pod holds one); rialto: GPUs leased through internal/placement (shared slots, dedicated, or composed across the rack)")
	if o.Sample > 1 {
		r.Notes = append(r.Notes, fmt.Sprintf("sampled: every %d-th node and pod", o.Sample))
	}
	return r, nil
}

// SampleOpenb keeps every k-th node and pod (proportions are kept: the
// pods still ask for about the same share of the remaining GPUs).
func SampleOpenb(nodes []TraceNode, pods []TracePod, k int) ([]TraceNode, []TracePod) {
	var n []TraceNode
	var p []TracePod
	for i := range nodes {
		if i%k == 0 {
			n = append(n, nodes[i])
		}
	}
	for i := range pods {
		if i%k == 0 {
			p = append(p, pods[i])
		}
	}
	return n, p
}
