package sim

import (
	"container/heap"
	"context"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// stdEvent / stdHeap: the peer for BenchmarkEngine — the same calendar built
// on the standard library's container/heap (binary heap through an
// interface), as most Go discrete-event code does.
type stdEvent struct {
	at  float64
	seq uint64
	fn  func()
}
type stdHeap []stdEvent

func (h stdHeap) Len() int { return len(h) }
func (h stdHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h stdHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *stdHeap) Push(x any)   { *h = append(*h, x.(stdEvent)) }
func (h *stdHeap) Pop() any {
	old := *h
	n := len(old) - 1
	x := old[n]
	*h = old[:n]
	return x
}

// cpuSeconds is the process's user+system CPU time: on a machine shared with
// other work, events per CPU second is the engine's own speed, events per
// wall second also counts the neighbours.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func BenchmarkEngineStdHeap(b *testing.B) {
	var h stdHeap
	var now float64
	var seq uint64
	r := newRand(1)
	var fn func()
	fn = func() { seq++; heap.Push(&h, stdEvent{now + r.Float64(), seq, fn}) }
	for i := 0; i < 10000; i++ {
		seq++
		heap.Push(&h, stdEvent{r.Float64(), seq, fn})
	}
	b.ResetTimer()
	c0 := cpuSeconds()
	for i := 0; i < b.N; i++ {
		ev := heap.Pop(&h).(stdEvent)
		now = ev.at
		ev.fn()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.N)/(cpuSeconds()-c0), "events/cpu-s")
}

// BenchmarkOpenbReplay replays the full openb trace (1,523 nodes, 8,152
// pods) under each policy; one iteration is one replay.
func BenchmarkOpenbReplay(b *testing.B) {
	nodes, pods, err := LoadOpenb(os.DirFS(sharedTraces), "")
	if err != nil {
		b.Skip("traces absent:", err)
	}
	for _, pol := range []string{PolicyWholeDevice, PolicyRialto} {
		b.Run(pol, func(b *testing.B) {
			c0 := cpuSeconds()
			for i := 0; i < b.N; i++ {
				cfg := DefaultGPUReplay
				cfg.Policy = pol
				res, err := ReplayGPU(context.Background(), nodes, pods, cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(res.Events), "sim-events")
				b.ReportMetric(float64(res.PlaceCalls), "place-calls")
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/replay")
			b.ReportMetric((cpuSeconds()-c0)/float64(b.N), "cpu-s/replay")
		})
	}
}

// BenchmarkScale is the synthetic data-centre run; RIALTO_SIM_NODES and
// RIALTO_SIM_LEASES override DefaultScale's 10,000 nodes and 1,000,000
// leases (the default here is a 100,000-lease run so that -bench . stays
// short; bench/sim/run.sh sets the full size).
func BenchmarkScale(b *testing.B) {
	sp := DefaultScale
	sp.Leases = 100000
	if v, err := strconv.Atoi(os.Getenv("RIALTO_SIM_NODES")); err == nil && v > 0 {
		sp.Nodes = v
	}
	if v, err := strconv.Atoi(os.Getenv("RIALTO_SIM_LEASES")); err == nil && v > 0 {
		sp.Leases = v
	}
	if v, err := strconv.Atoi(os.Getenv("RIALTO_SIM_CONCURRENCY")); err == nil && v > 0 {
		sp.Concurrency = v
	}
	for i := 0; i < b.N; i++ {
		start := time.Now()
		c0 := cpuSeconds()
		var peakHeap uint64
		res, err := RunScale(sp, func(done int) error {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peakHeap {
				peakHeap = ms.HeapInuse
			}
			b.Logf("%d leases after %v, heap in use %d MiB", done, time.Since(start).Round(time.Second), ms.HeapInuse>>20)
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > peakHeap {
			peakHeap = ms.HeapInuse
		}
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		el := time.Since(start).Seconds()
		b.ReportMetric(el, "s/run")
		b.ReportMetric(cpuSeconds()-c0, "cpu-s/run")
		b.ReportMetric(float64(res.Placed)/el, "leases/s")
		b.ReportMetric(float64(res.PlaceCalls)/(cpuSeconds()-c0), "decisions/cpu-s")
		b.ReportMetric(res.RemoteShare(), "remote-share")
		b.ReportMetric(res.ComposedShare(), "composed-share")
		b.ReportMetric(res.P99Slowdown, "p99-slowdown")
		b.ReportMetric(float64(res.Events)/el, "events/s")
		b.ReportMetric(float64(peakHeap>>20), "peak-heap-MiB")
		b.ReportMetric(float64(ru.Maxrss>>10), "maxrss-MiB")
		b.ReportMetric(float64(res.MaxActive), "max-active")
		b.ReportMetric(res.MeanSlowdown, "mean-slowdown")
		b.Logf("%+v", res)
	}
}
