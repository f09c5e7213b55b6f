package main

import (
	"testing"

	"github.com/rialto-project/rialto/api"
)

func TestParseNIC(t *testing.T) {
	for _, tc := range []struct {
		in    string
		iface string
		size  int64
		ok    bool
	}{
		{"wan=eth1:500mbit", "eth1", 62_500_000, true},
		{"up=wan0:1gbit", "wan0", 125_000_000, true},
		{"x=lo-does-not-exist", "lo-does-not-exist", 125_000_000, true}, // no speed known: 1 Gbit/s
		{"wan=eth1:fast", "", 0, false},
		{"eth1", "", 0, false},
		{"=eth1", "", 0, false},
		{"wan=", "", 0, false},
	} {
		d, err := parseNIC(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parseNIC(%q): %v", tc.in, err)
			continue
		}
		if tc.ok && (d.Kind != api.KindNIC || d.Path != tc.iface || d.Size != tc.size) {
			t.Errorf("parseNIC(%q) = %+v", tc.in, d)
		}
	}
}

func TestNICCapacity(t *testing.T) {
	for _, tc := range []struct {
		bytesPerSec int64
		want        string
	}{{62_500_000, "500Mbit/s"}, {1_250_000_000, "10Gbit/s"}, {12_500, "100kbit/s"}, {1, "8bit/s"}, {156_250_000, "1.25Gbit/s"}} {
		if got := capacity(api.KindNIC, tc.bytesPerSec); got != tc.want {
			t.Errorf("capacity(nic, %d) = %q, want %q", tc.bytesPerSec, got, tc.want)
		}
	}
}
