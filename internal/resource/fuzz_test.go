package resource

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// FuzzParseSize: sizes come from config files, flags, Slurm comments,
// the UI's forms and agents' device attributes. ParseSize never panics,
// refuses with ErrBadSize quoting what it was given, accepts only sizes
// in [0, 2⁶²] (MaxInt64/2 as a float64: room for sums), and reads FormatSize's text of what it accepted
// back to within FormatSize's rounding (one decimal of the unit).
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"256MiB", "2GiB", "1.5G", "4096", " 1 TB ", "0", "-1", "NaN", "Inf", "1e300KiB",
		"0x1p10", "1_000", "B", "KiB", "3.999999999999999999E", "4611686018427387904", "1kb", ".5k"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			if !errors.Is(err, ErrBadSize) || !strings.Contains(err.Error(), "resource: bad size") {
				t.Fatalf("ParseSize(%q): unclear refusal %v", s, err)
			}
			return
		}
		if n < 0 || n > 1<<62 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		text := FormatSize(n)
		back, err := ParseSize(text)
		if err != nil {
			t.Fatalf("FormatSize(%d) = %q, which ParseSize refuses: %v", n, text, err)
		}
		if d := math.Abs(float64(back) - float64(n)); d > 0.05*float64(n)+1 {
			t.Fatalf("%q is %d, printed %q, read back as %d", s, n, text, back)
		}
	})
}

// FuzzParseRate: rates come from flags (--bandwidth, --bandwidth-cap,
// --nic), quotas and the UI's form. ParseRate never panics, refuses with
// ErrBadRate quoting what it was given, accepts only rates in [0, 2⁶²]
// bytes/s, and reads FormatRate's and FormatLinkRate's text of what it
// accepted back to within their rounding (one decimal of the unit; below
// 95% of the bound, as a figure rounded up may print just over it).
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"500Mbit/s", "1gbit", "200MB/s", "64MiB/s", "2e9", "0", "-1", "NaN", "Inf", "1e300gbit",
		"mbit", "/s", "bit/s", "1.5 kbit/s", "100mbitps", " 3 GB/s ", "36893488147419103232bit"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseRate(s)
		if err != nil {
			if !errors.Is(err, ErrBadRate) || !strings.Contains(err.Error(), "want a rate such as") {
				t.Fatalf("ParseRate(%q): unclear refusal %v", s, err)
			}
			return
		}
		if v < 0 || v > 1<<62 || math.IsNaN(v) {
			t.Fatalf("ParseRate(%q) = %g", s, v)
		}
		if v > 0.95*(1<<62) {
			return // a figure rounded up may print just over the bound
		}
		for _, format := range []func(float64) string{FormatRate, FormatLinkRate} {
			text := format(v)
			back, err := ParseRate(text)
			if err != nil {
				t.Fatalf("%q is %g bytes/s, printed %q, which ParseRate refuses: %v", s, v, text, err)
			}
			if d := math.Abs(back - v); d > 0.05*v+1 {
				t.Fatalf("%q is %g bytes/s, printed %q, read back as %g", s, v, text, back)
			}
		}
	})
}
