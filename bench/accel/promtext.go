package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// metrics is a scrape of a Prometheus text exposition: each series (name
// and labels as exposed, e.g. `x_total{a="1"}`) and its value.
type metrics map[string]float64

// parseMetrics reads the text exposition format: comment lines are
// skipped, every other line is a series and a value (a timestamp after
// the value is ignored).
func parseMetrics(body string) (metrics, error) {
	m := metrics{}
	for n, line := range strings.Split(body, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		// The value follows the series: after the closing brace if there
		// are labels (label values may hold spaces), else after the name.
		rest := line
		series := ""
		if i := strings.LastIndexByte(line, '}'); i >= 0 {
			series, rest = line[:i+1], line[i+1:]
		} else if i := strings.IndexByte(line, ' '); i >= 0 {
			series, rest = line[:i], line[i:]
		}
		f := strings.Fields(rest)
		if series == "" || len(f) == 0 {
			return nil, fmt.Errorf("metrics line %d: %q", n+1, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", n+1, err)
		}
		m[series] += v
	}
	return m, nil
}

// sum adds the values of name's series that carry every label given as
// key=value pairs.
func (m metrics) sum(name string, labels ...string) float64 {
	var want []string
	for i := 0; i+1 < len(labels); i += 2 {
		want = append(want, labels[i]+`="`+labels[i+1]+`"`)
	}
	total := 0.0
next:
	for s, v := range m {
		if s != name && !strings.HasPrefix(s, name+"{") {
			continue
		}
		for _, w := range want {
			if !strings.Contains(s, "{"+w) && !strings.Contains(s, ","+w) {
				continue next
			}
		}
		total += v
	}
	return total
}

// scraper fetches an agent's /metrics.
type scraper struct {
	url string
	hc  *http.Client
}

func (s scraper) scrape(ctx context.Context) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", s.url, resp.Status)
	}
	return parseMetrics(string(b))
}
