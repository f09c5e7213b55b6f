package main

import (
	"io"
	"reflect"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/spf13/pflag"
)

// TestRequestFlagsSelectors: --label, --affinity, --anti-affinity and
// --work reach the lease request that create and explain send.
func TestRequestFlagsSelectors(t *testing.T) {
	var rf requestFlags
	fs := pflag.NewFlagSet("explain", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rf.register(fs)
	if err := fs.Parse([]string{"--kind", "memory", "--label", "disk=nvme", "--label", "zone=b", "--affinity", "n2", "--affinity", "dev-1",
		"--anti-affinity", "rack=r9", "--work", "150GB", "--deadline", "600"}); err != nil {
		t.Fatal(err)
	}
	r, err := rf.request()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r.Labels, map[string]string{"disk": "nvme", "zone": "b"}) || !reflect.DeepEqual(r.Affinity, []string{"n2", "dev-1"}) ||
		!reflect.DeepEqual(r.AntiAffinity, []string{"rack=r9"}) || r.Work != 150e9 || r.Size != 0 {
		t.Fatalf("%+v", r)
	}
	rf = requestFlags{}
	fs = pflag.NewFlagSet("explain", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rf.register(fs)
	if err := fs.Parse([]string{"--label", "nvme", "--size", "1GiB"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rf.request(); err == nil {
		t.Fatal("--label without = accepted")
	}
}

// TestRequestFlagsWhole: --whole (with --count, the least slots) reaches
// the request.
func TestRequestFlagsWhole(t *testing.T) {
	var rf requestFlags
	fs := pflag.NewFlagSet("create", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rf.register(fs)
	if err := fs.Parse([]string{"--kind", "accel", "--whole", "--count", "2"}); err != nil {
		t.Fatal(err)
	}
	r, err := rf.request()
	if err != nil || !r.Whole || r.Count != 2 || r.Mode != "" {
		t.Fatalf("%+v %v", r, err)
	}
}

// TestRequestFlagsBandwidth: --bandwidth takes link rates (bits) and
// sizes per second (bytes), and a bare number of bytes/s; nic requests
// carry it as their rate, bonds their count.
func TestRequestFlagsBandwidth(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64 // bytes/s; < 0: refused
	}{
		{"500Mbit/s", 62.5e6},
		{"500mbit", 62.5e6},
		{"1Gbit/s", 125e6},
		{"1.5 gbit/s", 187.5e6},
		{"100kbit/s", 12.5e3},
		{"800bit/s", 100},
		{"200MB/s", 200e6},
		{"64MiB/s", 64 << 20},
		{"2e9", 2e9},
		{"477000000", 477e6},
		{"fast", -1},
		{"-5Mbit/s", -1},
		{"Mbit/s", -1},
		{"\xbb\xbb/s", -1}, // not UTF-8: refused, not a panic
	} {
		var rf requestFlags
		fs := pflag.NewFlagSet("create", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		rf.register(fs)
		var r api.LeaseRequest
		err := fs.Parse([]string{"--kind", "nic", "--count", "2", "--bandwidth", c.in})
		if err == nil {
			r, err = rf.request()
		}
		switch {
		case c.want < 0 && err == nil:
			t.Errorf("%q: accepted as %g", c.in, r.Bandwidth)
		case c.want >= 0 && (err != nil || r.Bandwidth != c.want || r.Kind != "nic" || r.Count != 2):
			t.Errorf("%q: %+v %v, want %g bytes/s", c.in, r, err, c.want)
		}
	}
}

// TestRateFlagsPrintAsRates: --bandwidth and --bandwidth-cap show their
// value as rates print (resource.FormatRate), which they read back: not a
// size ("100MiB" for --bandwidth-cap 100MiB/s) nor binary units. A nic
// request's --bandwidth shows as a link rate (resource.FormatLinkRate), as
// its lease's size and its plan print: 500Mbit/s, not 62.5MB/s, whichever
// of --kind and --bandwidth comes first.
func TestRateFlagsPrintAsRates(t *testing.T) {
	for _, c := range []struct {
		flag, in, want string
		more           []string
	}{
		{"bandwidth", "500Mbit/s", "62.5MB/s", nil},
		{"bandwidth", "1.43GB/s", "1.43GB/s", nil},
		{"bandwidth", "500Mbit/s", "62.5MB/s", []string{"--kind", "memory"}},
		{"bandwidth", "500Mbit/s", "500Mbit/s", []string{"--kind", "nic"}},
		{"bandwidth", "62.5MB/s", "500Mbit/s", []string{"--kind", "nic"}},
		{"bandwidth", "1.25GB/s", "10Gbit/s", []string{"--kind", "nic"}},
		{"bandwidth-cap", "100MiB/s", "104.9MB/s", nil},
		{"bandwidth-cap", "800Mbit/s", "100MB/s", nil},
	} {
		var rf requestFlags
		fs := pflag.NewFlagSet("create", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		rf.register(fs)
		if err := fs.Parse(append([]string{"--" + c.flag, c.in}, c.more...)); err != nil {
			t.Fatal(err)
		}
		if got := fs.Lookup(c.flag).Value.String(); got != c.want {
			t.Errorf("--%s %s %v shows as %q, want %q", c.flag, c.in, c.more, got, c.want)
		}
		if err := fs.Set(c.flag, c.want); err != nil {
			t.Errorf("--%s does not read back %q: %v", c.flag, c.want, err)
		}
	}
}
