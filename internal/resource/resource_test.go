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
