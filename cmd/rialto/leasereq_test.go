package main

import (
	"flag"
	"io"
	"reflect"
	"testing"
)

// TestRequestFlagsSelectors: --label, --affinity, --anti-affinity and
// --work reach the lease request that create and explain send.
func TestRequestFlagsSelectors(t *testing.T) {
	var rf requestFlags
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
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
	fs = flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rf.register(fs)
	if err := fs.Parse([]string{"--label", "nvme"}); err != nil {
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
	fs := flag.NewFlagSet("create", flag.ContinueOnError)
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
