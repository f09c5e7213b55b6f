package metrics

import (
	"strings"
	"sync"
	"testing"
)

func TestExposition(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("rialto_requests_total", "Requests.", "code")
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				c.With("200").Inc()
			}
		}()
	}
	wg.Wait()
	r.Gauge("rialto_up", "Up.").With().Set(1)
	h := r.Histogram("rialto_latency_seconds", "Latency.", []float64{0.1, 1})
	h.With().Observe(0.05)
	h.With().Observe(0.5)
	var b strings.Builder
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	want := `# HELP rialto_latency_seconds Latency.
# TYPE rialto_latency_seconds histogram
rialto_latency_seconds_bucket{le="0.1"} 1
rialto_latency_seconds_bucket{le="1"} 2
rialto_latency_seconds_bucket{le="+Inf"} 2
rialto_latency_seconds_sum 0.55
rialto_latency_seconds_count 2
# HELP rialto_requests_total Requests.
# TYPE rialto_requests_total counter
rialto_requests_total{code="200"} 8000
# HELP rialto_up Up.
# TYPE rialto_up gauge
rialto_up 1
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}
