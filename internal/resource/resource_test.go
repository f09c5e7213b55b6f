package resource

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"4096", 4096, false},
		{"256MiB", 256 << 20, false},
		{"2GiB", 2 << 30, false},
		{"2gib", 2 << 30, false},
		{"1.5G", 3 << 29, false},
		{"10MB", 10e6, false},
		{"512B", 512, false},
		{"1.5PiB", 3 << 49, false},
		{"2EiB", 2 << 60, false},
		{"1PB", 1e15, false},
		{"4EiB", 4 << 60, false},
		{"5EiB", 0, true},
		{"", 0, true},
		{"-1", 0, true},
		{"MiB", 0, true},
		{"1e300GiB", 0, true},
		{"NaN", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, err=%v", tt.in, got, err, tt.want, tt.err)
		}
		if err != nil && !errors.Is(err, ErrBadSize) {
			t.Errorf("ParseSize(%q) error %v is not ErrBadSize", tt.in, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1KiB", 256 << 20: "256MiB", 3 << 29: "1.5GiB",
		5 << 28:               "1.25GiB",
		536432 << 10:          "523.9MiB", // not "536432KiB": the largest unit, rounded
		1234567:               "1.2MiB",
		1<<30 - 1<<10:         "1023.999MiB", // rounded, yet not as a whole figure
		1<<30 - 40<<10:        "1023.96MiB",  // nor as the next unit's "1024MiB"
		3<<40 + 1<<30:         "3.001TiB",
		1 << 40:               "1TiB",
		1<<62 + 1<<61:         "6EiB",
		math.MaxInt64 &^ 1023: "8.000EiB", // three decimals still round it: they say so
	} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64 // bytes/s; < 0: refused
	}{
		{"500Mbit/s", 62.5e6},
		{"500mbit", 62.5e6},
		{"500mbitps", 62.5e6},
		{"1Gbit/s", 125e6},
		{"1.5 gbit/s", 187.5e6},
		{"100kbit/s", 12.5e3},
		{"2Tbit/s", 250e9},
		{"8Ebit/s", 1e18},
		{"40Ebit/s", -1}, // over 2⁶² bytes/s
		{"800bit/s", 100},
		{"200MB/s", 200e6},
		{"476.8MB/s", 476.8e6},
		{"1.5kB/s", 1500},
		{"64MiB/s", 64 << 20},
		{"1GB", 1e9}, // a quota's bandwidth=1GB, as before rates had units of their own
		{"2e9", 2e9},
		{"477000000", 477e6},
		{"fast", -1},
		{"-5Mbit/s", -1},
		{"Mbit/s", -1},
		{"NaNbit/s", -1},
		{"", -1},
	} {
		got, err := ParseRate(c.in)
		switch {
		case c.want < 0 && (err == nil || !errors.Is(err, ErrBadRate) || !strings.Contains(err.Error(), "want a rate such as")):
			t.Errorf("ParseRate(%q) = %g, %v; want refused with ErrBadRate", c.in, got, err)
		case c.want >= 0 && (err != nil || got != c.want):
			t.Errorf("ParseRate(%q) = %g, %v; want %g", c.in, got, err, c.want)
		}
	}
}

// TestFormatRate: rates print in decimal bytes/s, the largest unit,
// exact or rounded, and ParseRate reads each back to within the rounding
// (one decimal of the unit).
func TestFormatRate(t *testing.T) {
	for _, c := range []struct {
		bps  float64
		want string
	}{
		{0, "0B/s"},
		{1, "1B/s"},
		{999, "999B/s"},
		{1000, "1kB/s"},
		{1500, "1.5kB/s"},
		{12.5e3, "12.5kB/s"},
		{100e6, "100MB/s"},
		{99999999.99999997, "100MB/s"}, // float noise: a whole figure
		{477e6, "477MB/s"},
		{476834512, "476.8MB/s"}, // rounded to one decimal
		{1e9 / 30, "33.3MB/s"},
		{64 << 20, "67.1MB/s"}, // 64MiB/s: decimal, as --bandwidth 67.1MB/s reads
		{2e9, "2GB/s"},
		{1.25e9, "1.25GB/s"},
		{1.297e9, "1.30GB/s"}, // rounded: three figures below 10
		{1.431e9, "1.43GB/s"}, // three SMUFIN writers' need…
		{1.4e9, "1.4GB/s"},    // …beside what one device delivers
		{4166.7e6, "4.17GB/s"},
		{12.534e9, "12.5GB/s"},
		{9.9996e9, "10.000GB/s"}, // rounded up to 10, and says it is rounded
		{2.0004e9, "2.000GB/s"},  // rounded, yet with the decimals that say so
		{999999999.9999995, "1GB/s"},
		{1 << 50, "1.13PB/s"},
		{2e18, "2EB/s"},
		{-1.5e6, "-1.5MB/s"},
		{math.Inf(1), "+InfB/s"},
	} {
		got := FormatRate(c.bps)
		if got != c.want {
			t.Errorf("FormatRate(%g) = %q, want %q", c.bps, got, c.want)
		}
		if c.bps <= 0 || math.IsInf(c.bps, 0) {
			continue
		}
		back, err := ParseRate(got)
		if err != nil {
			t.Errorf("FormatRate(%g) = %q, which ParseRate refuses: %v", c.bps, got, err)
		} else if d := math.Abs(back - c.bps); d > 0.05*c.bps+1 {
			t.Errorf("FormatRate(%g) = %q reads back as %g", c.bps, got, back)
		}
	}
}

// TestFormatLinkRate: a nic's rate prints in bits/s as flags and tc
// write it, and ParseRate reads it back.
func TestFormatLinkRate(t *testing.T) {
	for _, c := range []struct {
		bps  float64 // bytes/s
		want string
	}{
		{1, "8bit/s"},
		{12_500, "100kbit/s"},
		{62_500_000, "500Mbit/s"},
		{5e6, "40Mbit/s"},
		{2e9 / 3 / 8, "666.7Mbit/s"}, // a bond's third of 2Gbit/s
		{156_250_000, "1.25Gbit/s"},
		{1_250_000_000, "10Gbit/s"},
		{1 << 50, "9.01Pbit/s"}, // what a nic request may ask at most
		{1e18, "8Ebit/s"},
	} {
		got := FormatLinkRate(c.bps)
		if got != c.want {
			t.Errorf("FormatLinkRate(%g) = %q, want %q", c.bps, got, c.want)
		}
		back, err := ParseRate(got)
		if err != nil {
			t.Errorf("FormatLinkRate(%g) = %q, which ParseRate refuses: %v", c.bps, got, err)
		} else if d := math.Abs(back - c.bps); d > 0.05*c.bps+1 {
			t.Errorf("FormatLinkRate(%g) = %q reads back as %g", c.bps, got, back)
		}
	}
}

func TestSecrets(t *testing.T) {
	a, b := NewSecret("rlc"), NewSecret("rlc")
	if a == b || !strings.HasPrefix(a, "rlc_") || len(a) < 50 {
		t.Fatalf("bad secrets %q %q", a, b)
	}
	if Fingerprint(a) == Fingerprint(b) || strings.Contains(Fingerprint(a), a[4:12]) {
		t.Fatal("fingerprint leaks or collides")
	}
	if id := NewID("lease"); !strings.HasPrefix(id, "lease-") || len(id) != len("lease-")+12 {
		t.Fatalf("bad id %q", id)
	}
}
