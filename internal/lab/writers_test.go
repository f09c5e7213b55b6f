package lab

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/sim/report"
)

func TestSimulateFairShare(t *testing.T) {
	// 3 writers on 2 lenders of 10 MB/s: 20 MB/s × efficiency shared by 3.
	got, whole := SimulateWriters(2, 3, 10e6, 30e6)
	want := 2 * 10e6 * WireEfficiency / 3
	for i, g := range got {
		if d := g/want - 1; d > 1e-9 || d < -1e-9 || whole[i] != g {
			t.Fatalf("got %v (whole %v) want %v", got, whole, want)
		}
	}
}

// MinLinkBusy is the least Row.LinkBusy at which a scenario's errors are
// asserted: the lender links must have been sending for this share of the
// makespan, or the real side was not bound by them (on a loaded machine the
// writers' CPU was; the simulator models links, not the borrower's CPU).
// Whether the machine is loaded does not matter otherwise: a scenario whose
// links were busy is asserted whatever the load average or Row.Headroom.
const MinLinkBusy = 0.95

func TestRealVsSimulated(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	// One and three lenders, with one writer alone and with six per link
	// (where TCP's unfairness showed); the full matrix is bench/sim/run.sh's
	// (RIALTO_VALIDATE_FULL), the package's other tests share its minute.
	cfg := WritersConfig{Lenders: []int{1, 3}, Writers: []int{1, 6}, Bytes: 4 << 20}
	timeout := 3 * time.Minute
	if os.Getenv("RIALTO_VALIDATE_FULL") != "" {
		cfg.Lenders, cfg.Writers, cfg.Bytes = []int{1, 2, 3}, []int{1, 2, 3, 4, 5, 6}, 8<<20
		timeout = 15 * time.Minute
	}
	if testing.Short() {
		cfg.Lenders, cfg.Writers = []int{1, 2}, []int{1, 3}
	}
	// Knobs for exploring the real side (docs/simulator.md).
	cfg.Rate = os.Getenv("RIALTO_VALIDATE_RATE")
	cfg.Queue = os.Getenv("RIALTO_VALIDATE_QUEUE")
	cfg.CongestionControl = os.Getenv("RIALTO_VALIDATE_CC")
	if v := ints(os.Getenv("RIALTO_VALIDATE_LENDERS")); v != nil {
		cfg.Lenders = v
	}
	if v := ints(os.Getenv("RIALTO_VALIDATE_WRITERS")); v != nil {
		cfg.Writers = v
	}
	if v := ints(os.Getenv("RIALTO_VALIDATE_MIB")); len(v) == 1 {
		cfg.Bytes = int64(v[0]) << 20
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rows, err := RunWriters(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("load average %.1f; tbf %s per lender, queue %s, congestion control %s, %d MiB per writer and lender",
		loadAverage(), orDefault(cfg.Rate, DefaultRate), orDefault(cfg.Queue, "1.25 MB"), orDefault(cfg.CongestionControl, DefaultCongestionControl), cfg.Bytes>>20)
	okWriter, okMakespan, asserted := 0, 0, 0
	defer func() {
		t.Logf("summary: per-writer error within 10%% in %d of %d scenarios, makespan within 10%% in %d of %d; %d asserted (links busy >= %.0f%%)", okWriter, len(rows), okMakespan, len(rows), asserted, 100*MinLinkBusy)
	}()
	for _, r := range rows {
		mb := make([]string, len(r.RealWhole))
		for i, v := range r.RealWhole {
			mb[i] = strconv.FormatFloat(v/1e6, 'f', 2, 64)
		}
		t.Logf("%d lenders, %d writers: real %s MB/s per writer, simulated %.2f; per-writer error max %.1f%%, makespan error %.1f%%; headroom %.1f×, links busy %.1f%%",
			r.Lenders, r.Writers, strings.Join(mb, " "), r.SimWhole[0]/1e6, 100*r.MaxWholeError(), 100*r.AggregateError(), r.Headroom, 100*r.LinkBusy)
		if r.MaxWholeError() <= 0.10 {
			okWriter++
		}
		if r.AggregateError() <= 0.10 {
			okMakespan++
		}
		if r.LinkBusy < MinLinkBusy {
			// The writers left the shaped links idle part of the time, so
			// the links (what the simulator models) did not bound them:
			// the machine was busy elsewhere. Measure it once more.
			again, err := rerun(ctx, cfg, r)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d lenders, %d writers: links busy %.1f%% < %.0f%% of the makespan: not link-bound (headroom %.1f×); re-run: links busy %.1f%%", r.Lenders, r.Writers, 100*r.LinkBusy, 100*MinLinkBusy, r.Headroom, 100*again.LinkBusy)
			if again.LinkBusy < MinLinkBusy {
				continue
			}
			r = again
		}
		asserted++
		if e := r.MaxWholeError(); e > 0.10 {
			// TCP's split of a link among flows is itself random: in about
			// 1 of 190 runs of a scenario one writer got well ahead with the
			// links fully busy. A model error repeats; such an outlier does
			// not. So a miss is measured once more and the re-run decides.
			again, err := rerun(ctx, cfg, r)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d lenders, %d writers: per-writer error %.1f%% > 10%%; re-run: %.1f%% (links busy %.1f%%)", r.Lenders, r.Writers, 100*e, 100*again.MaxWholeError(), 100*again.LinkBusy)
			if again.LinkBusy >= MinLinkBusy && again.MaxWholeError() > 0.10 {
				t.Errorf("%d lenders %d writers: per-writer error %.1f%%, then %.1f%% on a re-run > 10%%", r.Lenders, r.Writers, 100*e, 100*again.MaxWholeError())
			}
		}
	}
	if dir := os.Getenv("RIALTO_VALIDATE_OUT"); dir != "" {
		if _, err := report.Write(WritersResult(rows, cfg), dir); err != nil {
			t.Fatal(err)
		}
	}
	if asserted == 0 {
		t.Fatalf("no scenario kept its links busy, even on a re-run (load average %.1f): the real side was never bound by its links, so nothing could be compared", loadAverage())
	}
}

// rerun measures one scenario of cfg again.
func rerun(ctx context.Context, cfg WritersConfig, r WriterRow) (WriterRow, error) {
	cfg.Lenders, cfg.Writers = []int{r.Lenders}, []int{r.Writers}
	rows, err := RunWriters(ctx, cfg)
	if err != nil {
		return WriterRow{}, err
	}
	for _, x := range rows {
		if x.Lenders == r.Lenders && x.Writers == r.Writers {
			return x, nil
		}
	}
	return WriterRow{}, fmt.Errorf("re-run of %d lenders, %d writers gave no row", r.Lenders, r.Writers)
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

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Fields(s) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}
