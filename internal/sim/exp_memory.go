package sim

import (
	"context"
	"fmt"
)

func init() {
	register("remote-memory-modes", "seed 001 Fig. 15: slowdown vs all-local memory with 75% borrowed memory, direct (CRMA) vs swap (RDMA) vs local swap, per application locality", runMemoryModes)
	register("redis-memory", "seed 001 Fig. 14: Redis-like cache, 10,000 Zipf queries with 70–350 MB of borrowed vs local memory", runRedisMemory)
}

func runRedisMemory(ctx context.Context, o Options) (Result, error) {
	spec := DefaultRedis
	spec.Queries = int(float64(spec.Queries) * o.scale())
	const mb = 1e6
	const localMin = 50 * mb // the paper keeps 50 MB local for Redis to start
	r := Result{Header: []string{"memory_MB", "mode", "seconds", "hit_rate"}}
	r.Plot = Plot{Title: "Redis with borrowed memory (seed 001, Fig. 14)", XLabel: "total memory (MB)", YLabel: "seconds for 10,000 queries", LogY: true}
	remote := Series{Name: "50 MB local + borrowed"}
	local := Series{Name: "all local"}
	var t70, t350, l350 float64
	for m := 70.0; m <= 350; m += 70 {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		rem, ev1 := RunRedis(spec, m*mb, localMin, o.Seed)
		loc, ev2 := RunRedis(spec, m*mb, m*mb, o.Seed)
		r.Events += ev1 + ev2
		r.Rows = append(r.Rows, []string{ftoa(m), "remote", ftoa(rem.Seconds), ftoa(rem.HitRate)}, []string{ftoa(m), "local", ftoa(loc.Seconds), ftoa(loc.HitRate)})
		remote.X, remote.Y = append(remote.X, m), append(remote.Y, rem.Seconds)
		local.X, local.Y = append(local.X, m), append(local.Y, loc.Seconds)
		switch m {
		case 70:
			t70 = rem.Seconds
		case 350:
			t350, l350 = rem.Seconds, loc.Seconds
			r.Metrics = append(r.Metrics, Metric{Name: "miss rate at 350 MB", Value: 1 - rem.HitRate, Paper: 0.05, Tolerance: 0.3})
		}
	}
	sc := 10000 / float64(spec.Queries)
	r.Plot.Series = []Series{remote, local}
	r.Metrics = append(r.Metrics,
		Metric{Name: "time at 70 MB (per 10,000 queries)", Value: t70 * sc, Unit: "s", Paper: 11900, Tolerance: 0.1},
		Metric{Name: "time at 350 MB (per 10,000 queries)", Value: t350 * sc, Unit: "s", Paper: 758, Tolerance: 0.1},
		Metric{Name: "speed-up 70 MB -> 350 MB", Value: t70 / t350, Unit: "x", Paper: 15.7, Tolerance: 0.1},
		Metric{Name: "borrowed vs local memory at 350 MB", Value: t350 / l350, Unit: "x", Paper: 1.07, Tolerance: 0.03},
	)
	r.Notes = append(r.Notes, fmt.Sprintf("keys %d × %.0f B, Zipf s=%.2f, hit %.1f/%.1f ms local/borrowed, miss %.2f s", spec.Keys, spec.ItemBytes, spec.ZipfS, spec.HitLocal*1e3, spec.HitRemote*1e3, spec.Miss))
	return r, nil
}

func runMemoryModes(ctx context.Context, o Options) (Result, error) {
	m := DefaultMemoryModel
	r := Result{Header: []string{"app", "stall_share", "page_reuse", "direct_slowdown", "swap_slowdown", "local_swap_slowdown", "best_mode", "best_slowdown", "mode_ratio"}}
	r.Plot = Plot{Title: "Remote memory with 75% borrowed (seed 001, Fig. 15)", YLabel: "run time / all local", LogY: true}
	d, s, l := Series{Name: "direct (CRMA)"}, Series{Name: "swap (RDMA)"}, Series{Name: "local swap"}
	lo, hi, ratio := 1e9, 0.0, 0.0
	for i, a := range Seed001Apps {
		dd, ss, ll := m.Slowdowns(a)
		best, mode := dd, "direct"
		if ss < dd {
			best, mode = ss, "swap"
		}
		rt := max(dd, ss) / min(dd, ss)
		lo, hi, ratio = min(lo, best), max(hi, best), max(ratio, rt)
		r.Rows = append(r.Rows, []string{a.Name, ftoa(a.Stall), ftoa(a.Reuse), ftoa(dd), ftoa(ss), ftoa(ll), mode, ftoa(best), ftoa(rt)})
		r.Plot.Categories = append(r.Plot.Categories, a.Name)
		d.X, d.Y = append(d.X, float64(i)), append(d.Y, dd)
		s.X, s.Y = append(s.X, float64(i)), append(s.Y, ss)
		l.X, l.Y = append(l.X, float64(i)), append(l.Y, ll)
	}
	r.Plot.Series = []Series{d, s, l}
	crossover := m.PageFault / (m.CRMA - m.Local)
	r.Metrics = []Metric{
		{Name: "smallest slowdown (best mode)", Value: lo, Unit: "x", Paper: 1.03, Tolerance: 0.05},
		{Name: "largest slowdown (best mode)", Value: hi, Unit: "x", Paper: 2.5, Tolerance: 0.1},
		{Name: "largest direct/swap difference", Value: ratio, Unit: "x", Paper: 6.8, Tolerance: 0.1},
		{Name: "page reuse where swap starts to win", Value: crossover, Unit: "accesses/page"},
	}
	r.Notes = append(r.Notes, "application profiles (memory-stall share, page reuse) are assumptions spanning random to streaming access; the model's content is the crossover: direct wins for pages touched fewer than PageFault/(CRMA−Local) times while resident, swap above")
	return r, ctx.Err()
}
