package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files under testdata/")

// TestTablesGolden pins the table layouts people read.
func TestTablesGolden(t *testing.T) {
	var b bytes.Buffer
	// A node that is not ready shows its health unknown, also from a
	// control plane that still answers its last report.
	nodes := []api.Node{
		{ID: "node-b", Name: "node2", State: api.NodeSuspect, Address: "10.0.0.2", Health: "ok",
			Fingerprint: api.Fingerprint{Cores: 64, MemoryBytes: 256 << 30}},
		{ID: "node-a", Name: "node1", State: api.NodeReady, Address: "10.0.0.1",
			Fingerprint: api.Fingerprint{Cores: 8, MemoryBytes: 16 << 30}},
	}
	b.WriteString("== nodes\n")
	printNodes(&b, nodes)
	names := map[string]string{"node-a": "node1", "node-b": "node2"}
	b.WriteString("== devices\n")
	printDevices(&b, []api.Device{
		{ID: "dev-2", NodeID: "node-b", Name: "nvme0", Kind: api.KindBlock, State: "available", Capacity: 2 << 40, Allocated: 512 << 30, Sharing: "partitionable"},
		{ID: "dev-1", NodeID: "node-a", Name: "accel0", Kind: api.KindAccel, State: "unavailable", Capacity: 4 * api.SlotUnits, Allocated: 2250, Sharing: "exclusive"},
	}, names)
	// A lease that asked for a whole device has no size of its own: it
	// holds its part's length (the API's held).
	whole := api.Lease{ID: "lease-5", State: api.LeaseActive, Kind: api.KindBlock, Mode: api.ModeDedicated, Held: 2 << 40, Count: 1, NodeID: "node-b", DeviceID: "dev-2", Tenant: "alice",
		Parts: []api.Part{{NodeID: "node-b", DeviceID: "dev-2", Length: 2 << 40, URI: "nbds://10.0.0.2:10809/x"}}}
	// EXPIRES IN reads short and stably (tableSpan): whole seconds under
	// an hour, minutes under a day, hours beyond; "-" for a lease ended.
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	expires := func(l api.Lease, in time.Duration) api.Lease { l.ExpiresAt = now.Add(in); return l }
	b.WriteString("== leases\n")
	printLeases(&b, []api.Lease{
		{ID: "lease-1", State: api.LeaseReleased, Kind: api.KindBlock, Mode: api.ModeShared, Size: 256 << 20, Held: 256 << 20, Count: 1, NodeID: "node-a", DeviceID: "dev-1", Tenant: "alice"},
		{ID: "lease-2", State: api.LeaseLost, Kind: api.KindMemory, Mode: api.ModeDedicated, Size: 1 << 30, Held: 1 << 30, Count: 1, NodeID: "node-gone", Tenant: "bob"},
		expires(api.Lease{ID: "lease-4", State: api.LeaseActive, Kind: api.KindAccel, Mode: api.ModeShared, Size: api.SlotUnits / 4, Held: api.SlotUnits / 4, Count: 1, NodeID: "node-a", DeviceID: "dev-1", Tenant: "bob"}, 59*time.Minute+58123456*time.Microsecond),
		expires(whole, 2*time.Hour+5*time.Minute+12*time.Second),
		// A composed lease is on each of its parts' nodes and devices, a
		// bond's lost part left out; more than three nodes are counted.
		expires(api.Lease{ID: "lease-8", State: api.LeaseActive, Kind: api.KindBlock, Mode: api.ModeComposed, Size: 2 << 30, Held: 2 << 30, Count: 2, NodeID: "node-a", DeviceID: "dev-1", Tenant: "alice",
			Parts: []api.Part{{NodeID: "node-a", DeviceID: "dev-1", Length: 1 << 30}, {NodeID: "node-b", DeviceID: "dev-2", Length: 1 << 30}}}, 76*time.Hour+10*time.Minute),
		expires(api.Lease{ID: "lease-9", State: api.LeaseActive, Kind: api.KindNIC, Mode: api.ModeShared, Size: 250e6, Held: 125e6, Count: 1, NodeID: "node-b", DeviceID: "dev-4", Tenant: "bob",
			Parts: []api.Part{{NodeID: "node-a", DeviceID: "dev-3", Length: 125e6, State: api.PartLost}, {NodeID: "node-b", DeviceID: "dev-4", Length: 125e6}}}, -3*time.Second),
		expires(api.Lease{ID: "lease-10", State: api.LeaseActive, Kind: api.KindBlock, Mode: api.ModeComposed, Size: 4 << 30, Held: 4 << 30, Count: 4, NodeID: "node-a", DeviceID: "dev-1", Tenant: "alice",
			Parts: []api.Part{{NodeID: "node-a", DeviceID: "dev-1", Length: 1 << 30}, {NodeID: "node-b", DeviceID: "dev-2", Length: 1 << 30},
				{NodeID: "node-c", DeviceID: "dev-5", Length: 1 << 30}, {NodeID: "node-d", DeviceID: "dev-6", Length: 1 << 30}}}, 42400*time.Millisecond),
	}, names, now)
	// A lease's caps (--bandwidth-cap, --iops-cap) show, the bandwidth as
	// every rate prints (resource.FormatRate).
	b.WriteString("== lease\n")
	printLease(&b, api.Lease{ID: "lease-3", State: api.LeaseLost, Reason: "lender node node2 (node-b) is down", Kind: api.KindBlock,
		Mode: api.ModeComposed, Size: 3 << 30, Held: 3 << 30, Count: 3, StripeUnit: 1 << 20, Tenant: "alice", NodeID: "node-a", DeviceID: "dev-1",
		TTLSeconds: 3600, IdempotencyKey: "job-7", BandwidthCap: 100 << 20, IOPSCap: 2000,
		Parts: []api.Part{{NodeID: "node-a", DeviceID: "dev-1", Length: 1 << 30, URI: "nbd://10.0.0.1:10809/x.0"}, {NodeID: "node-b", DeviceID: "dev-2", Offset: 1 << 30, Length: 1 << 30}}}, names)

	b.WriteString("== shared accel lease\n")
	printLease(&b, api.Lease{ID: "lease-4", State: api.LeaseActive, Kind: api.KindAccel, Mode: api.ModeShared, Size: api.SlotUnits / 4, Held: api.SlotUnits / 4, Count: 1,
		Tenant: "bob", NodeID: "node-a", DeviceID: "dev-1", TTLSeconds: 3600,
		Parts: []api.Part{{NodeID: "node-a", DeviceID: "dev-1", Offset: 1250, Length: 250, URI: "rialto-accel://10.0.0.1:7001/x?gateway=sha256"}}}, names)

	b.WriteString("== whole-device lease, with why\n")
	whole.Plan = &api.Plan{State: "feasible", Explanation: []string{
		"request: block whole device for alice",
		"rejected: some devices",
		"  dev-1: capacity: 0B free of 1GiB, 1 lease",
		"mode: a whole device was asked for, so dedicated",
	}}
	printLease(&b, whole, names)

	b.WriteString("== dedicated lease of a size, on a larger device\n")
	printLease(&b, api.Lease{ID: "lease-6", State: api.LeaseActive, Kind: api.KindBlock, Mode: api.ModeDedicated, Size: 256 << 20, Held: 1 << 30, Count: 1, NodeID: "node-a", DeviceID: "dev-1",
		Parts: []api.Part{{NodeID: "node-a", DeviceID: "dev-1", Length: 1 << 30}}}, names)

	// A nic lease is sized by its rate, shown as a link rate
	// (resource.FormatLinkRate): a bond's thirds rounded, not "666.666664Mbit/s".
	b.WriteString("== nic bond\n")
	printLease(&b, api.Lease{ID: "lease-7", State: api.LeaseActive, Kind: api.KindNIC, Mode: api.ModeShared, Size: 250e6, Held: 250e6, Count: 3, NodeID: "node-a", DeviceID: "dev-3",
		Parts: []api.Part{{NodeID: "node-a", DeviceID: "dev-3", Length: 83_333_333}, {NodeID: "node-b", DeviceID: "dev-4", Length: 83_333_333},
			{NodeID: "node-b", DeviceID: "dev-5", Length: 83_333_334}}}, names)

	// Links' bandwidths print as every rate does (resource.FormatRate);
	// one whose bandwidth is not known shows "-".
	b.WriteString("== topology\n")
	if err := printTopology(&b, api.Topology{Nodes: nodes, Links: []api.Link{
		{ID: "node-b>controlplane", From: "node-b", To: "controlplane", Kind: "ethernet", Status: "up", RTTMicros: 310},
		{ID: "node-a>node-b", From: "node-a", To: "node-b", Kind: "ethernet", Status: "up", RTTMicros: 95.4, BandwidthBps: 1_250_000_000},
		{ID: "node-a>controlplane", From: "node-a", To: "controlplane", Kind: "ethernet", Status: "down", RTTMicros: 1200, BandwidthBps: 117_187_500},
	}}, time.Time{}); err != nil {
		t.Fatal(err)
	}

	path := filepath.Join("testdata", "tables.golden")
	if *rewrite {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TablesGolden -rewrite)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("tables changed (go test -run TablesGolden -rewrite to accept):\n%s", b.String())
	}
}
