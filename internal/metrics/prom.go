package metrics

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// LatencyBuckets are latency histogram bounds in seconds, from 10µs to
// 10s: finer at the low end than prometheus.DefBuckets, for data-plane and
// store latencies.
var LatencyBuckets = []float64{1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// RegisterRuntime registers the Go runtime and process collectors (go_*,
// process_*) with r. A component that shares its process with another one
// that reports them (an agent inside `rialto up`) leaves them out, so that
// a process is counted once.
func RegisterRuntime(r prometheus.Registerer) {
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// Register registers c with r and returns it, or returns the collector
// already registered with the same descriptors (several gateways or
// appliances in one agent share one family and tell their series apart by
// label). Any other registration error is a programming error and panics.
func Register[C prometheus.Collector](r prometheus.Registerer, c C) C {
	err := r.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if old, ok := are.ExistingCollector.(C); ok {
			return old
		}
	}
	panic(fmt.Sprintf("metrics: %v", err))
}

// Value is the value of the counter or gauge name (of a histogram: its
// count of observations) with the given label pairs (name, value, name,
// value...) in what g gathers, and whether it was found. Tests read
// metrics with it.
func Value(g prometheus.Gatherer, name string, labelPairs ...string) (float64, bool) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labelPairs); i += 2 {
				if labelValue(m, labelPairs[i]) != labelPairs[i+1] {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// Family is a metric family as registered: what a scraper sees of it
// whatever its series.
type Family struct {
	Name, Type, Help string
	Labels           []string // variable label names, in order
}

// String is one line: name type {labels} help.
func (f Family) String() string {
	return fmt.Sprintf("%s %s {%s} %s", f.Name, f.Type, strings.Join(f.Labels, ","), f.Help)
}

// Families calls register with a Registerer that records every collector
// registered through it (into a fresh registry, so duplicates are caught
// as they would be), and returns their families sorted by name. Metric
// vectors are typed by their Go type; any other collector must produce at
// least one metric of each of its descriptors.
func Families(register func(prometheus.Registerer)) ([]Family, error) {
	rec := &recorder{Registry: prometheus.NewRegistry()}
	register(rec)
	if rec.err != nil {
		return nil, rec.err
	}
	var out []Family
	for _, c := range rec.collectors {
		fams, err := describe(c)
		if err != nil {
			return nil, err
		}
		out = append(out, fams...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
	err        error
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil && r.err == nil {
			r.err = err
		}
	}
}

var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "[^"]*", constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)

func describe(c prometheus.Collector) ([]Family, error) {
	typ := ""
	// A vector may have no series yet: typed by its Go type. Any other
	// collector (a single metric, a Func, a collector of its own) is typed
	// from what it collects.
	switch c.(type) {
	case *prometheus.CounterVec:
		typ = "counter"
	case *prometheus.GaugeVec:
		typ = "gauge"
	case *prometheus.HistogramVec:
		typ = "histogram"
	case *prometheus.SummaryVec:
		typ = "summary"
	}
	types := map[string]string{} // by descriptor, for other collectors
	if typ == "" {
		ch := make(chan prometheus.Metric)
		go func() {
			c.Collect(ch)
			close(ch)
		}()
		for m := range ch {
			var d dto.Metric
			if err := m.Write(&d); err != nil {
				return nil, err
			}
			t := "untyped"
			switch {
			case d.Counter != nil:
				t = "counter"
			case d.Gauge != nil:
				t = "gauge"
			case d.Histogram != nil:
				t = "histogram"
			case d.Summary != nil:
				t = "summary"
			}
			types[m.Desc().String()] = t
		}
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var out []Family
	var err error
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			err = fmt.Errorf("metrics: cannot read descriptor %s", d)
			continue
		}
		f := Family{Type: typ}
		f.Name, _ = strconv.Unquote(m[1])
		f.Help, _ = strconv.Unquote(m[2])
		if m[3] != "" {
			f.Labels = append(f.Labels, strings.Split(m[3], ",")...) // const labels: name="value"
		}
		if m[4] != "" {
			f.Labels = append(f.Labels, strings.Split(m[4], ",")...)
		}
		if f.Type == "" {
			if f.Type = types[d.String()]; f.Type == "" {
				err = fmt.Errorf("metrics: %s produced no metric to tell its type", f.Name)
			}
		}
		out = append(out, f)
	}
	return out, err
}
