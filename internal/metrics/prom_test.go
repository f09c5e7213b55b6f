package metrics

import (
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func newTasks() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_test_tasks_total", Help: "Tasks."}, []string{"slot"})
}

func TestRegisterSharesFamilies(t *testing.T) {
	r := prometheus.NewRegistry()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			Register(r, newTasks()).WithLabelValues(strings.Repeat("x", i%2+1)).Inc()
		}()
	}
	wg.Wait()
	for slot, want := range map[string]float64{"x": 4, "xx": 4} {
		if v, ok := Value(r, "rialto_test_tasks_total", "slot", slot); !ok || v != want {
			t.Errorf("slot %s: %v %v, want %v", slot, v, ok, want)
		}
	}
	if _, ok := Value(r, "rialto_test_tasks_total", "slot", "none"); ok {
		t.Error("a series that does not exist was found")
	}
	// The same name with another help is a programming error.
	defer func() {
		if recover() == nil {
			t.Error("a conflicting registration did not panic")
		}
	}()
	Register(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rialto_test_tasks_total", Help: "Other."}, []string{"slot"}))
}

// customCollector is a collector of its own (not one of client_golang's
// metric types): Families types it from what it collects.
type customCollector struct{ desc *prometheus.Desc }

func (c customCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c customCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, "disk0")
}

func TestFamilies(t *testing.T) {
	fams, err := Families(func(r prometheus.Registerer) {
		Register(r, newTasks())
		r.MustRegister(prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rialto_test_seconds", Help: `Latency "quoted", back\slash.`, Buckets: LatencyBuckets}),
			prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rialto_test_level", Help: "Level.", ConstLabels: prometheus.Labels{"k": "v"}}, []string{"a", "b"}),
			prometheus.NewSummary(prometheus.SummaryOpts{Name: "rialto_test_summary_seconds", Help: "Summary."}),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rialto_test_func_total", Help: "Func."}, func() float64 { return 1 }),
			customCollector{prometheus.NewDesc("rialto_test_used_bytes", "Used.", []string{"device"}, nil)})
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fams {
		got = append(got, f.String())
	}
	want := []string{
		`rialto_test_func_total counter {} Func.`,
		`rialto_test_level gauge {k="v",a,b} Level.`,
		`rialto_test_seconds histogram {} Latency "quoted", back\slash.`,
		`rialto_test_summary_seconds summary {} Summary.`,
		`rialto_test_tasks_total counter {slot} Tasks.`,
		`rialto_test_used_bytes gauge {device} Used.`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A duplicate registration is reported, as a registry would.
	if _, err := Families(func(r prometheus.Registerer) { r.MustRegister(newTasks(), newTasks()) }); err == nil {
		t.Error("a duplicate registration was not reported")
	}
	// A collector that collects nothing cannot be typed.
	if _, err := Families(func(r prometheus.Registerer) {
		r.MustRegister(emptyCollector{prometheus.NewDesc("rialto_test_nothing", "Nothing.", nil, nil)})
	}); err == nil || !strings.Contains(err.Error(), "rialto_test_nothing") {
		t.Errorf("untypable collector: %v", err)
	}
}

type emptyCollector struct{ desc *prometheus.Desc }

func (c emptyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c emptyCollector) Collect(chan<- prometheus.Metric)    {}

func TestRegisterRuntime(t *testing.T) {
	r := prometheus.NewRegistry()
	RegisterRuntime(r)
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := Value(r, name); !ok {
			t.Errorf("no %s", name)
		}
	}
}
