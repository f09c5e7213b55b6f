package stats

import (
	"math"
	"os"
	"strings"
	"testing"
)

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestParseCPU parses captured /proc/stat heads and malformed lines.
func TestParseCPU(t *testing.T) {
	for _, c := range []struct {
		name, in     string
		steal, total float64
		err          string
	}{
		{name: "captured", in: readTestdata(t, "proc_stat_before"), steal: 3545, total: 2165320 + 144745 + 924146 + 260578 + 6074 + 0 + 173257 + 3545},
		{name: "guest not counted twice", in: "cpu  100 0 50 800 0 0 0 50 40 0\n", steal: 50, total: 1000},
		{name: "empty", in: "", err: "want a \"cpu\" line"},
		{name: "per-cpu line first", in: "cpu0 1 2 3 4 5 6 7 8\n", err: "want a \"cpu\" line"},
		{name: "short", in: "cpu 1 2 3 4 5 6 7\n", err: "want a \"cpu\" line"},
		{name: "not a number", in: "cpu 1 2 x 4 5 6 7 8\n", err: "field 3"},
		{name: "negative", in: "cpu 1 2 3 4 5 6 7 -8\n", err: "field 8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := ParseCPU(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("ParseCPU error = %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.steal != c.steal || s.total != c.total {
				t.Fatalf("ParseCPU = steal %v total %v, want %v %v", s.steal, s.total, c.steal, c.total)
			}
		})
	}
}

// TestStealUntil: the percentage between two samples.
func TestStealUntil(t *testing.T) {
	parse := func(s string) CPUSample {
		x, err := ParseCPU(s)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	before, after := parse(readTestdata(t, "proc_stat_before")), parse(readTestdata(t, "proc_stat_after"))
	for _, c := range []struct {
		name     string
		from, to CPUSample
		pct      float64
		ok       bool
	}{
		// 1 tick stolen of 404 between the two captures.
		{"captured", before, after, 100.0 / 404, true},
		{"half stolen", parse("cpu 100 0 0 0 0 0 0 0"), parse("cpu 150 0 0 0 0 0 0 50"), 50, true},
		{"no time passed", before, before, 0, false},
		{"backwards", after, before, 0, false},
		{"missing first sample", CPUSample{}, after, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			pct, ok := c.from.StealUntil(c.to)
			if ok != c.ok || math.Abs(pct-c.pct) > 1e-9 {
				t.Fatalf("StealUntil = %v, %v; want %v, %v", pct, ok, c.pct, c.ok)
			}
		})
	}
	// The live reader: /proc/stat is there and moves forward.
	s := SampleCPU()
	if s.total == 0 {
		t.Fatal("SampleCPU read nothing from /proc/stat")
	}
	if pct := s.StealSince(); pct < 0 || pct > 100 {
		t.Fatalf("StealSince = %v", pct)
	}
}

// FuzzParseCPU: any text gives a sample or an error, never a panic; a
// sample's steal is part of its total.
func FuzzParseCPU(f *testing.F) {
	for _, name := range []string{"proc_stat_before", "proc_stat_after"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("cpu 1 2 3 4 5 6 7 8 9 10\n")
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseCPU(in)
		if err != nil {
			return
		}
		if s.steal < 0 || s.steal > s.total {
			t.Fatalf("ParseCPU(%q): steal %v, total %v", in, s.steal, s.total)
		}
	})
}
