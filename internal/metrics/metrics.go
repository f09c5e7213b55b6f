package metrics

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Registry holds named metric families and writes them in the Prometheus
// text exposition format.
type Registry struct {
	mu       sync.Mutex
	families map[string]*family
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{families: make(map[string]*family)} }

type family struct {
	name, help, typ string
	labels          []string
	buckets         []float64

	mu     sync.Mutex
	series map[string]series // key: joined label values
}

type series interface {
	write(w io.Writer, name, labels string)
}

func (r *Registry) family(name, help, typ string, labels []string, buckets []float64) *family {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.families[name]; ok {
		if f.typ != typ {
			panic(fmt.Sprintf("metrics: %s registered as %s and %s", name, f.typ, typ))
		}
		return f
	}
	f := &family{name: name, help: help, typ: typ, labels: labels, buckets: buckets, series: make(map[string]series)}
	r.families[name] = f
	return f
}

func (f *family) get(values []string, mk func() series) series {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s wants %d label values, got %d", f.name, len(f.labels), len(values)))
	}
	key := strings.Join(values, "\xff")
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.series[key]
	if !ok {
		s = mk()
		f.series[key] = s
	}
	return s
}

// Counter is a monotonically increasing float64.
type Counter struct{ bits atomic.Uint64 }

// Add adds v, which must not be negative.
func (c *Counter) Add(v float64) {
	for {
		old := c.bits.Load()
		if c.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// Inc adds one.
func (c *Counter) Inc() { c.Add(1) }

// Value returns the current value.
func (c *Counter) Value() float64 { return math.Float64frombits(c.bits.Load()) }

func (c *Counter) write(w io.Writer, name, labels string) {
	fmt.Fprintf(w, "%s%s %s\n", name, labels, fmtFloat(c.Value()))
}

// Gauge is a float64 that can go up and down.
type Gauge struct{ Counter }

// Set sets the gauge to v.
func (g *Gauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }

// Histogram counts observations into cumulative buckets.
type Histogram struct {
	mu      sync.Mutex
	buckets []float64
	counts  []uint64
	sum     float64
	count   uint64
}

// Observe records v.
func (h *Histogram) Observe(v float64) {
	h.mu.Lock()
	for i, b := range h.buckets {
		if v <= b {
			h.counts[i]++
		}
	}
	h.sum += v
	h.count++
	h.mu.Unlock()
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count
}

func (h *Histogram) write(w io.Writer, name, labels string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	inner := strings.TrimSuffix(strings.TrimPrefix(labels, "{"), "}")
	sep := ""
	if inner != "" {
		sep = ","
	}
	for i, b := range h.buckets {
		fmt.Fprintf(w, "%s_bucket{%s%sle=%q} %d\n", name, inner, sep, fmtFloat(b), h.counts[i])
	}
	fmt.Fprintf(w, "%s_bucket{%s%sle=\"+Inf\"} %d\n", name, inner, sep, h.count)
	fmt.Fprintf(w, "%s_sum%s %s\n", name, labels, fmtFloat(h.sum))
	fmt.Fprintf(w, "%s_count%s %d\n", name, labels, h.count)
}

// DefBuckets are latency buckets in seconds, from 10µs to 10s.
var DefBuckets = []float64{1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Counter returns the counter name{labels...=values...}, creating it if needed.
func (r *Registry) Counter(name, help string, labels ...string) *CounterVec {
	return &CounterVec{r.family(name, help, "counter", labels, nil)}
}

// Gauge returns a gauge family.
func (r *Registry) Gauge(name, help string, labels ...string) *GaugeVec {
	return &GaugeVec{r.family(name, help, "gauge", labels, nil)}
}

// Histogram returns a histogram family with the given upper bounds (nil
// means DefBuckets).
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *HistogramVec {
	if buckets == nil {
		buckets = DefBuckets
	}
	return &HistogramVec{r.family(name, help, "histogram", labels, buckets)}
}

// CounterVec is a counter family.
type CounterVec struct{ f *family }

// With returns the counter for the label values.
func (v *CounterVec) With(values ...string) *Counter {
	return v.f.get(values, func() series { return new(Counter) }).(*Counter)
}

// GaugeVec is a gauge family.
type GaugeVec struct{ f *family }

// With returns the gauge for the label values.
func (v *GaugeVec) With(values ...string) *Gauge {
	return v.f.get(values, func() series { return new(Gauge) }).(*Gauge)
}

// HistogramVec is a histogram family.
type HistogramVec struct{ f *family }

// With returns the histogram for the label values.
func (v *HistogramVec) With(values ...string) *Histogram {
	return v.f.get(values, func() series {
		return &Histogram{buckets: v.f.buckets, counts: make([]uint64, len(v.f.buckets))}
	}).(*Histogram)
}

// WriteTo writes every family in the text exposition format.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	fams := make([]*family, 0, len(r.families))
	for _, f := range r.families {
		fams = append(fams, f)
	}
	r.mu.Unlock()
	sort.Slice(fams, func(i, j int) bool { return fams[i].name < fams[j].name })
	cw := &countWriter{w: w}
	for _, f := range fams {
		fmt.Fprintf(cw, "# HELP %s %s\n# TYPE %s %s\n", f.name, escapeHelp(f.help), f.name, f.typ)
		f.mu.Lock()
		keys := make([]string, 0, len(f.series))
		for k := range f.series {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			f.series[k].write(cw, f.name, labelString(f.labels, k))
		}
		f.mu.Unlock()
	}
	return cw.n, cw.err
}

// ServeHTTP serves the registry.
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	r.WriteTo(w)
}

func labelString(names []string, key string) string {
	if len(names) == 0 {
		return ""
	}
	values := strings.Split(key, "\xff")
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n)
		b.WriteString("=")
		b.WriteString(strconv.Quote(values[i]))
	}
	b.WriteByte('}')
	return b.String()
}

func escapeHelp(s string) string {
	return strings.NewReplacer("\\", `\\`, "\n", `\n`).Replace(s)
}

func fmtFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}
