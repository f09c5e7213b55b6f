package validate

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/sim/report"
)

func TestSimulateFairShare(t *testing.T) {
	// 3 writers on 2 lenders of 10 MB/s: 20 MB/s × efficiency shared by 3.
	got, whole := Simulate(2, 3, 10e6, 30e6)
	want := 2 * 10e6 * WireEfficiency / 3
	for i, g := range got {
		if d := g/want - 1; d > 1e-9 || d < -1e-9 || whole[i] != g {
			t.Fatalf("got %v (whole %v) want %v", got, whole, want)
		}
	}
}

func TestRealVsSimulated(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	cfg := Config{Lenders: []int{1, 2, 3}, Writers: []int{1, 4}, Bytes: 8 << 20}
	var ctxFull context.Context
	if os.Getenv("RIALTO_VALIDATE_FULL") != "" {
		cfg.Writers, cfg.Bytes = []int{1, 2, 3, 4, 5, 6}, 16<<20
		ctx2, cancel2 := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel2()
		ctxFull = ctx2
	}
	if testing.Short() {
		cfg.Lenders, cfg.Writers = []int{1, 2}, []int{1, 3}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if ctxFull != nil {
		ctx = ctxFull
	}
	rows, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The real side needs the CPU: on an overloaded machine (load average
	// above the CPU count) the writers are starved and the comparison says
	// more about the neighbours than about the model, so it is only logged.
	load, ncpu := loadAverage(), runtime.NumCPU()
	strict := load <= float64(ncpu)
	if !strict {
		t.Logf("load average %.1f on %d CPUs: errors are logged, not asserted", load, ncpu)
	}
	okWriter, okMakespan := 0, 0
	defer func() {
		t.Logf("summary: per-writer error within 10%% in %d of %d scenarios, makespan within 10%% in %d of %d", okWriter, len(rows), okMakespan, len(rows))
	}()
	for _, r := range rows {
		mb := make([]string, len(r.RealWhole))
		for i, v := range r.RealWhole {
			mb[i] = strconv.FormatFloat(v/1e6, 'f', 2, 64)
		}
		t.Logf("%d lenders, %d writers: real %s MB/s per writer, simulated %.2f; per-writer error max %.1f%%, makespan error %.1f%%",
			r.Lenders, r.Writers, strings.Join(mb, " "), r.SimWhole[0]/1e6, 100*r.MaxWholeError(), 100*r.AggregateError())
		if r.MaxWholeError() <= 0.10 {
			okWriter++
		}
		if r.AggregateError() <= 0.10 {
			okMakespan++
		}
		// The simulator's fair shares hold for the aggregate; single TCP
		// flows through one tbf FIFO on a shared 2-core box are up to ~20%
		// unfair to one another (see docs/simulator.md), hence the wider
		// per-writer bound.
		if strict && r.AggregateError() > 0.10 {
			t.Errorf("%d lenders %d writers: makespan error %.1f%% > 10%%", r.Lenders, r.Writers, 100*r.AggregateError())
		}
		if strict && r.MaxWholeError() > 0.30 {
			t.Errorf("%d lenders %d writers: per-writer error %.1f%% > 30%%", r.Lenders, r.Writers, 100*r.MaxWholeError())
		}
	}
	if dir := os.Getenv("RIALTO_VALIDATE_OUT"); dir != "" {
		if _, err := report.Write(Result(rows, cfg), dir); err != nil {
			t.Fatal(err)
		}
	}
}

func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
