package controlplane

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/placement"
)

// joinModel registers a node whose block devices are of the given model.
func (e *env) joinModel(name, model string, sizes ...int64) []api.Device {
	e.t.Helper()
	req := api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
		Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30}}
	for i, sz := range sizes {
		req.Devices = append(req.Devices, api.DeviceSpec{Name: "disk" + string(rune('0'+i)), Kind: api.KindBlock, Capacity: sz, Model: model, Sharing: "partitionable"})
	}
	jr, err := e.boot.Join(e.ctx(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	devs, err := e.admin.Devices(e.ctx())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []api.Device
	for _, d := range devs {
		if d.NodeID == jr.NodeID {
			out = append(out, d)
		}
	}
	return out
}

func seed000APIProfile() api.Profile {
	p := placement.SMUFINProfile()
	return api.Profile{Model: p.Model, WriteBps: p.Delivered, Source: "declared"}
}

// TestProfilesAndDemandReachPlacement: with the seed-000 profile declared
// and two 477 MB/s writers running on one device, explaining a third shows
// what it would do to them.
func TestProfilesAndDemandReachPlacement(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	devs := e.joinModel("n1", placement.SMUFINModel, 64<<30)
	if _, err := e.admin.PutProfile(e.ctx(), seed000APIProfile()); err != nil {
		t.Fatal(err)
	}
	writer := api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 1 << 30, Bandwidth: placement.SMUFINWriterDemand, Work: 150e9}
	for i := 0; i < 2; i++ {
		l, err := e.alice.CreateLease(e.ctx(), writer)
		if err != nil {
			t.Fatal(err)
		}
		if l.DeviceID != devs[0].ID {
			t.Fatalf("lease on %s", l.DeviceID)
		}
	}
	plan, err := e.alice.Explain(e.ctx(), writer)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan.Explanation, "\n")
	if len(plan.Impacts) != 2 || plan.Impacts[0].BandwidthAfter >= plan.Impacts[0].BandwidthBefore || plan.Impacts[0].CompletionAfter <= 0 {
		t.Fatalf("no predicted impact on the running leases: %+v\n%s", plan, text)
	}
	// An impact names the slowed lease's kind, in whose units the CLI
	// and the UI print its rates.
	if plan.Impacts[0].Kind != api.KindBlock || plan.Impacts[1].Kind != api.KindBlock {
		t.Fatalf("impacts without the leases' kind: %+v", plan.Impacts)
	}
	if strings.Contains(text, "no running lease slowed") {
		t.Fatalf("explanation says no running lease slowed:\n%s", text)
	}
	t.Logf("plan %s %+v\n%s", plan.State, plan.Impacts, text)

	// A profile stored later reaches placement too (the cache is dropped).
	p := seed000APIProfile()
	p.WriteBps = []float64{4e9}
	if _, err := e.admin.PutProfile(e.ctx(), p); err != nil {
		t.Fatal(err)
	}
	plan2, err := e.alice.Explain(e.ctx(), writer)
	if err != nil {
		t.Fatal(err)
	}
	if plan2.State != "feasible" || len(plan2.Impacts) != 0 {
		t.Fatalf("with a 4 GB/s flat profile: %+v", plan2)
	}
}

func TestDevicePinning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.joinModel("n1", "", 1<<30)
	b := e.joinModel("n2", "", 1<<30)
	for _, req := range []api.LeaseRequest{
		{Kind: api.KindBlock, Mode: api.ModeShared, Size: 1 << 20},
		{Kind: api.KindBlock, Size: 1 << 20},
		{Kind: api.KindBlock, Mode: api.ModeDedicated},
	} {
		req.Affinity = []string{b[0].ID}
		l, err := e.alice.CreateLease(e.ctx(), req)
		if err != nil {
			t.Fatalf("%+v: %v", req, err)
		}
		if l.DeviceID != b[0].ID {
			t.Fatalf("%+v placed on %s, pinned to %s", req, l.DeviceID, b[0].ID)
		}
		if _, err := e.alice.ReleaseLease(e.ctx(), l.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Held whole, the pinned device refuses, though another is free.
	held, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Affinity: []string{b[0].ID}})
	if err != nil || held.DeviceID != b[0].ID {
		t.Fatalf("%v %+v", err, held)
	}
	for _, req := range []api.LeaseRequest{
		{Kind: api.KindBlock, Mode: api.ModeDedicated},
		{Kind: api.KindBlock, Mode: api.ModeShared, Size: 1 << 20},
		{Kind: api.KindBlock, Size: 1 << 20},
	} {
		req.Affinity = []string{b[0].ID}
		_, err = e.alice.CreateLease(e.ctx(), req)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity || !strings.Contains(ae.Message, "pinned device n2/disk0 ("+b[0].ID+")") {
			t.Fatalf("%+v on a held pinned device: %v", req, err)
		}
	}
	// The other device is still usable without a pin.
	if l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated}); err != nil || l.DeviceID != a[0].ID {
		t.Fatalf("%v %+v", err, l)
	}
	// A pin to a device of another kind is refused.
	if _, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20, Affinity: []string{a[0].ID}}); !api.IsCode(err, api.CodeInfeasible) {
		t.Fatalf("memory pinned to a block device: %v", err)
	}
}

func TestProfileValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	good := api.Profile{Model: "m", WriteBps: []float64{1e9, 9e8}, ReadBps: []float64{2e9}, Latency4KUs: 80}
	if _, err := e.admin.PutProfile(e.ctx(), good); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		mod  func(*api.Profile)
		want string
	}{
		{"zero write", func(p *api.Profile) { p.WriteBps = []float64{1e9, 0} }, "write_bps[1]"},
		{"negative read", func(p *api.Profile) { p.ReadBps = []float64{-1} }, "read_bps[0]"},
		{"negative latency", func(p *api.Profile) { p.Latency4KUs = -1 }, "latency_4k_us"},
	} {
		p := good
		c.mod(&p)
		_, err := e.admin.PutProfile(e.ctx(), p)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// With no mode, a block request larger than any one device is composed
// over several (placement weighs composition itself); asking for shared
// explicitly keeps it infeasible.
func TestNoModeMayCompose(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinModel("n1", "", 1<<30)
	e.joinModel("n2", "", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 3 << 29})
	if err != nil {
		t.Fatal(err)
	}
	if l.Mode != api.ModeComposed || len(l.Parts) < 2 {
		t.Fatalf("1.5 GiB over 1 GiB devices: mode %s with %d parts, want composed", l.Mode, len(l.Parts))
	}
	var total int64
	for _, p := range l.Parts {
		total += p.Length
	}
	if total < 3<<29 {
		t.Fatalf("parts hold %d bytes, want ≥ %d", total, int64(3<<29))
	}
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 3 << 29})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity {
		t.Fatalf("shared 1.5 GiB: %v, want 422", err)
	}
}

// Caps asked for at creation reach every part's lender; caps are refused
// for kinds that have no byte stream to cap.
func TestCapsReachLenders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinModel("n1", "", 1<<30)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 1 << 20,
		BandwidthCap: 50 << 20, IOPSCap: 500})
	if err != nil {
		t.Fatal(err)
	}
	e.lender.mu.Lock()
	n := 0
	for _, req := range e.lender.exports {
		if req.LeaseID != l.ID {
			continue
		}
		n++
		if req.BandwidthCap != 50<<20 || req.IOPSCap != 500 {
			t.Errorf("prepare of %s carried caps %d B/s, %d IOPS", req.DeviceID, req.BandwidthCap, req.IOPSCap)
		}
	}
	e.lender.mu.Unlock()
	if n == 0 {
		t.Fatal("no prepare recorded for the lease")
	}
	for _, bad := range []api.LeaseRequest{
		{Kind: api.KindBlock, Size: 1 << 20, BandwidthCap: -1},
		{Kind: api.KindMemory, Size: 1 << 20, IOPSCap: 10},
	} {
		_, err := e.alice.CreateLease(e.ctx(), bad)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
			t.Errorf("%+v: %v, want 400", bad, err)
		}
	}
}

// joinSpecs registers a node with the given labels and devices.
func (e *env) joinSpecs(name string, labels map[string]string, specs ...api.DeviceSpec) string {
	e.t.Helper()
	req := api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1", Labels: labels,
		Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30}, Devices: specs}
	jr, err := e.boot.Join(e.ctx(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	return jr.NodeID
}

func wantCode(t *testing.T, err error, status int, parts ...string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != status {
		t.Fatalf("got %v, want HTTP %d", err, status)
	}
	for _, p := range parts {
		if !strings.Contains(ae.Message, p) {
			t.Fatalf("error %q does not say %q", ae.Message, p)
		}
	}
}

// TestEveryKindPlacedByPolicy: block, memory and accel requests, sized or
// whole, with selectors or not, are all decided by internal/placement:
// every plan carries its request, its choice and the reason for its mode.
func TestEveryKindPlacedByPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinSpecs("n1", map[string]string{"zone": "a"},
		api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"},
		api.DeviceSpec{Name: "disk1", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"},
		api.DeviceSpec{Name: "mem0", Kind: api.KindMemory, Capacity: 1 << 30, Sharing: "partitionable"},
		api.DeviceSpec{Name: "fpga0", Kind: api.KindAccel, Capacity: 4, Sharing: "partitionable"},
		api.DeviceSpec{Name: "gpu0", Kind: api.KindAccel, Capacity: 1, Sharing: "exclusive"})
	e.joinSpecs("n2", map[string]string{"zone": "b"},
		api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "exclusive"},
		api.DeviceSpec{Name: "mem0", Kind: api.KindMemory, Capacity: 1 << 30, Sharing: "partitionable"})
	for _, req := range []api.LeaseRequest{
		{Kind: api.KindBlock, Size: 1 << 20},
		{Kind: api.KindBlock},
		{Kind: api.KindBlock, Mode: api.ModeDedicated},
		{Kind: api.KindBlock, Size: 1 << 20, Labels: map[string]string{"zone": "b"}},
		{Kind: api.KindBlock, Size: 3 << 28, Count: 2, Mode: api.ModeComposed},
		{Kind: api.KindMemory, Size: 1 << 20},
		{Kind: api.KindMemory},
		{Kind: api.KindMemory, Size: 1 << 20, Labels: map[string]string{"zone": "b"}},
		{Kind: api.KindAccel},
		{Kind: api.KindAccel, Count: 2},
		{Kind: api.KindAccel, Mode: api.ModeDedicated},
		{Kind: api.KindAccel, Whole: true},
		{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo"},
	} {
		plan, err := e.alice.Explain(e.ctx(), req)
		if err != nil || plan.State != "feasible" || len(plan.Parts) == 0 {
			t.Fatalf("%+v: %v %+v", req, err, plan)
		}
		text := strings.Join(plan.Explanation, "\n")
		for _, want := range []string{"request: " + string(req.Kind), "chose ", "mode: "} {
			if !strings.Contains(text, want) {
				t.Fatalf("%+v: explanation lacks %q:\n%s", req, want, text)
			}
		}
	}
}

// TestWholeDeviceLease: size 0 asks for a whole unused device, block or
// memory; once none is left the refusal says why for each candidate.
func TestWholeDeviceLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinSpecs("n1", nil,
		api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"},
		api.DeviceSpec{Name: "mem0", Kind: api.KindMemory, Capacity: 2 << 30, Sharing: "partitionable"})
	for _, kind := range []api.Kind{api.KindBlock, api.KindMemory} {
		plan, err := e.alice.Explain(e.ctx(), api.LeaseRequest{Kind: kind})
		if err != nil || plan.State != "feasible" || !strings.Contains(strings.Join(plan.Explanation, "\n"), "whole device") {
			t.Fatalf("%s explain: %v %+v", kind, err, plan)
		}
		l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: kind})
		if err != nil {
			t.Fatal(err)
		}
		if l.Mode != api.ModeDedicated || len(l.Parts) != 1 || l.Parts[0].Offset != 0 || l.Parts[0].Length < 1<<30 {
			t.Fatalf("%s whole: %+v", kind, l)
		}
		_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: kind})
		wantCode(t, err, http.StatusUnprocessableEntity, "dedicated to another lease")
		// A part of a device held whole is refused too.
		_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: kind, Size: 1 << 20})
		wantCode(t, err, http.StatusUnprocessableEntity, "dedicated to another lease")
	}
	// A whole device is dedicated: shared needs a size.
	_, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared})
	wantCode(t, err, http.StatusBadRequest, "whole device")
}

// TestLabelSelector: labels select donor nodes, for every kind; a
// selector nobody matches is refused naming the label each node lacks,
// and explain shows the same without reserving.
func TestLabelSelector(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinSpecs("hdd", map[string]string{"disk": "hdd"},
		api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"})
	nvme := e.joinSpecs("nvme", map[string]string{"disk": "nvme"},
		api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"},
		api.DeviceSpec{Name: "disk1", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"},
		api.DeviceSpec{Name: "mem0", Kind: api.KindMemory, Capacity: 1 << 30, Sharing: "partitionable"})
	for _, req := range []api.LeaseRequest{
		{Kind: api.KindBlock, Size: 1 << 20, Labels: map[string]string{"disk": "nvme"}},
		{Kind: api.KindBlock, Labels: map[string]string{"disk": "nvme"}},
		{Kind: api.KindMemory, Size: 1 << 20, Labels: map[string]string{"disk": "nvme"}},
	} {
		l, err := e.alice.CreateLease(e.ctx(), req)
		if err != nil {
			t.Fatalf("%+v: %v", req, err)
		}
		if l.Parts[0].NodeID != nvme {
			t.Fatalf("%+v placed on %s, want the nvme node %s", req, l.Parts[0].NodeID, nvme)
		}
	}
	bad := api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Labels: map[string]string{"disk": "optane"}}
	_, err := e.alice.CreateLease(e.ctx(), bad)
	wantCode(t, err, http.StatusUnprocessableEntity, "labels", "lacks label disk=optane")
	plan, err := e.alice.Explain(e.ctx(), bad)
	if err != nil || plan.State != "infeasible" {
		t.Fatalf("explain: %v %+v", err, plan)
	}
	text := strings.Join(plan.Explanation, "\n")
	if !strings.Contains(text, "placement: infeasible (labels)") || strings.Count(text, "lacks label disk=optane") != 2 {
		t.Fatalf("explanation does not name the constraint and both candidates:\n%s", text)
	}
	// Affinity may name a node by name.
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Affinity: []string{"hdd"}})
	if err != nil || l.Parts[0].NodeID == nvme {
		t.Fatalf("affinity by node name: %v %+v", err, l)
	}
}

// TestExclusiveDevice: an exclusive device is lent whole only: a shared
// request skips it for a partitionable one, falls back to dedicating it
// when no mode was asked for, and is refused once it is held.
func TestExclusiveDevice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	excl := e.joinSpecs("x", nil, api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "exclusive"})
	_, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 1 << 20})
	wantCode(t, err, http.StatusUnprocessableEntity, "exclusive", "lent whole only")
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 2 << 20})
	wantCode(t, err, http.StatusUnprocessableEntity, "lent whole only")

	part := e.joinSpecs("p", nil, api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"})
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil || l.Mode != api.ModeShared || l.Parts[0].NodeID != part {
		t.Fatalf("shared next to an exclusive device: %v %+v", err, l)
	}
	// No mode and the partitionable device pinned away: the exclusive
	// device is dedicated whole.
	l, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, AntiAffinity: []string{part}})
	if err != nil || l.Mode != api.ModeDedicated || l.Parts[0].NodeID != excl || l.Parts[0].Length != 1<<30 {
		t.Fatalf("exclusive device with no mode: %v %+v", err, l)
	}
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, AntiAffinity: []string{part}})
	wantCode(t, err, http.StatusUnprocessableEntity, "held whole")
}

// wantQuota asserts a 429 quota_exceeded whose message contains want.
func wantQuota(t *testing.T, err error, want string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || ae.Code != api.CodeQuota || !strings.Contains(ae.Message, want) {
		t.Fatalf("want 429 quota_exceeded with %q, got %v", want, err)
	}
}

// TestQuota: placement enforces per-tenant quotas — a default for every
// tenant, overrides per tenant — on leases, bytes, slots and bandwidth,
// through the HTTP API; a refusal is 429 with placement's reason, explain
// shows it without reserving, and a release makes room again.
func TestQuota(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) {
		c.Quotas = Quotas{Default: Quota{Leases: 2}, Tenants: map[string]Quota{"bob": {Bytes: 3 << 20, Slots: api.SlotUnits, Bandwidth: 100e6}}}
	})
	e.joinSpecs("n1", nil,
		api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"},
		api.DeviceSpec{Name: "fpga0", Kind: api.KindAccel, Capacity: 4, Sharing: "partitionable"})
	small := api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}
	var ids []string
	for i := 0; i < 2; i++ {
		l, err := e.alice.CreateLease(e.ctx(), small)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
	}
	_, err := e.alice.CreateLease(e.ctx(), small)
	wantQuota(t, err, "tenant alice holds 2 of 2 leases")
	plan, err := e.alice.Explain(e.ctx(), small)
	if err != nil || plan.State != "infeasible" || !strings.Contains(strings.Join(plan.Explanation, "\n"), "(quota)") {
		t.Fatalf("explain over quota: %v %+v", err, plan)
	}
	// bob's own quota replaces the default: no lease count, but bytes,
	// slots and bandwidth.
	_, err = e.bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Bandwidth: 200e6})
	wantQuota(t, err, "would use 200MB/s of 100MB/s")
	for i := 0; i < 3; i++ {
		if _, err := e.bob.CreateLease(e.ctx(), small); err != nil {
			t.Fatalf("bob lease %d: %v", i, err)
		}
	}
	_, err = e.bob.CreateLease(e.ctx(), small)
	wantQuota(t, err, "would hold 4MiB of 3MiB")
	if _, err := e.bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel}); err != nil {
		t.Fatal(err)
	}
	_, err = e.bob.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel})
	wantQuota(t, err, "would hold 2 slots of 1 slot")
	if _, err := e.alice.ReleaseLease(e.ctx(), ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.CreateLease(e.ctx(), small); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	// The admin tenant has the default quota too.
	if _, err := e.admin.CreateLease(e.ctx(), small); err != nil {
		t.Fatal(err)
	}
}

func TestParseQuota(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		spec, tenant string
		q            Quota
		err          string
	}{
		{"leases=10", "", Quota{Leases: 10}, ""},
		{"*:slots=4", "", Quota{Slots: 4 * api.SlotUnits}, ""},
		{"slots=2.25", "", Quota{Slots: 2250}, ""},
		{"slots=many", "", Quota{}, "bad slots"},
		{"alice:leases=3,bytes=2GiB,slots=1,bandwidth=1GB", "alice", Quota{Leases: 3, Bytes: 2 << 30, Slots: api.SlotUnits, Bandwidth: 1e9}, ""},
		{"alice:", "", Quota{}, "no limits"},
		{":leases=1", "", Quota{}, "empty tenant"},
		{"leases", "", Quota{}, "not KEY=VALUE"},
		{"cpus=1", "", Quota{}, "unknown limit"},
		{"leases=-1", "", Quota{}, "bad leases"},
		{"bytes=lots", "", Quota{}, "bad bytes"},
		// bandwidth= takes a rate as --bandwidth does, and as a refusal
		// prints it ("would use 200MB/s of 100MB/s").
		{"bandwidth=100MB/s", "", Quota{Bandwidth: 100e6}, ""},
		{"bandwidth=800Mbit/s", "", Quota{Bandwidth: 100e6}, ""},
		{"bandwidth=fast", "", Quota{}, "bad bandwidth"},
	} {
		tenant, q, err := ParseQuota(c.spec)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: want error %q, got %v", c.spec, c.err, err)
			}
			continue
		}
		if err != nil || tenant != c.tenant || q != c.q {
			t.Errorf("%q: got %q %+v %v", c.spec, tenant, q, err)
		}
	}
}

// TestAccelModes: an accel lease is dedicated (slots of its own, the
// default, and its mode says so) or shared (through the lender's gateway);
// a whole device is asked for with whole. Dedicated slots never take more
// than asked, and other leases still fit beside them, in the cached index
// (lease create) and in a fresh snapshot (explain).
func TestAccelModes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinSpecs("n1", nil,
		api.DeviceSpec{Name: "fpga0", Kind: api.KindAccel, Capacity: 4, Sharing: "partitionable"},
		api.DeviceSpec{Name: "fpga1", Kind: api.KindAccel, Capacity: 4, Sharing: "partitionable"})
	slots := func(l api.Lease) (n int64) {
		for _, p := range l.Parts {
			n += p.Length
		}
		return n
	}
	create := func(req api.LeaseRequest, mode api.Mode, n int64) api.Lease {
		t.Helper()
		l, err := e.alice.CreateLease(e.ctx(), req)
		if err != nil {
			t.Fatalf("%+v: %v", req, err)
		}
		if n *= api.SlotUnits / 4; l.Mode != mode || slots(l) != n || l.Plan == nil || l.Plan.Mode != mode {
			t.Fatalf("%+v: got mode %s, %d slots (%+v), want %s, %d", req, l.Mode, slots(l), l.Parts, mode, n)
		}
		return l
	}
	// n counts quarter slots.
	one := create(api.LeaseRequest{Kind: api.KindAccel, Role: "echo"}, api.ModeDedicated, 4)
	create(api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeDedicated}, api.ModeDedicated, 4)
	sh := create(api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo"}, api.ModeShared, 1) // the default share
	// 3 of 8 slots are taken (one by a share), all on one device
	// (binpack): the other is still whole.
	whole := create(api.LeaseRequest{Kind: api.KindAccel, Whole: true}, api.ModeDedicated, 16)
	if whole.Parts[0].DeviceID == one.Parts[0].DeviceID {
		t.Fatalf("whole device %s is the one the slot leases use", whole.Parts[0].DeviceID)
	}
	plan, err := e.alice.Explain(e.ctx(), api.LeaseRequest{Kind: api.KindAccel, Whole: true})
	if err != nil || plan.State != "infeasible" {
		t.Fatalf("second whole device: %v %+v", err, plan)
	}
	plan, err = e.alice.Explain(e.ctx(), api.LeaseRequest{Kind: api.KindAccel})
	if err != nil || plan.State != "feasible" || plan.Mode != api.ModeDedicated || !strings.Contains(strings.Join(plan.Explanation, "\n"), "accel: dedicated, 1 slot of its own") {
		t.Fatalf("slot beside the others (fresh snapshot): %v %+v", err, plan)
	}
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel, Count: 2})
	wantCode(t, err, http.StatusUnprocessableEntity)
	e.alice.ReleaseLease(e.ctx(), whole.ID)
	create(api.LeaseRequest{Kind: api.KindAccel, Count: 2}, api.ModeDedicated, 8)
	create(api.LeaseRequest{Kind: api.KindAccel, Count: 2}, api.ModeDedicated, 8)
	create(api.LeaseRequest{Kind: api.KindAccel}, api.ModeDedicated, 4)
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel})
	wantCode(t, err, http.StatusUnprocessableEntity)
	// Every slot is taken but the shared one, which has 0.75 slot left:
	// shares of its gateway (role echo, no config) fit there, inside it;
	// another role's share does not.
	sh2 := create(api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo", Share: 0.5}, api.ModeShared, 2)
	if a, b := sh.Parts[0], sh2.Parts[0]; a.DeviceID != b.DeviceID || a.Offset/api.SlotUnits != b.Offset/api.SlotUnits || sh2.Size != 500 {
		t.Fatalf("the second share is not in the first's slot: %+v, %+v (size %d)", a, b, sh2.Size)
	}
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256", Share: 0.25})
	wantCode(t, err, http.StatusUnprocessableEntity, "empty or shared by the same gateway")
	_, err = e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo", Share: 0.5})
	wantCode(t, err, http.StatusUnprocessableEntity)
	create(api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo", Share: 0.25}, api.ModeShared, 1)
	// The lender is asked for a gateway for shared leases only.
	for k, pr := range e.lender.exports {
		if want := strings.HasPrefix(k, sh.ID+"/"); pr.Gateway != want && (pr.LeaseID == sh.ID || pr.LeaseID == one.ID) {
			t.Fatalf("%s: gateway %v", k, pr.Gateway)
		}
		if pr.LeaseID == one.ID && pr.Mode != api.ModeDedicated {
			t.Fatalf("prepare of a slot lease says %s", pr.Mode)
		}
	}
	for _, c := range []struct {
		req  api.LeaseRequest
		want string
	}{
		{api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeComposed, Count: 2}, "not composed"},
		{api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo", Whole: true}, "whole device is dedicated"},
		{api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo", Share: 1.5}, "not a share of one slot"},
		{api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo", Share: 0.0001}, "not a share of one slot"},
		{api.LeaseRequest{Kind: api.KindAccel, Share: 0.5}, "share applies to shared accel leases"},
	} {
		_, err := e.alice.CreateLease(e.ctx(), c.req)
		wantCode(t, err, http.StatusBadRequest, c.want)
	}
}

// TestQuotaReplacement: a lease re-placed after its lender did not confirm
// is not counted against its own tenant's quota.
func TestQuotaReplacement(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.Quotas = Quotas{Default: Quota{Leases: 1, Bytes: 256 << 20}} })
	e.join("n1", 1<<30)
	e.join("n2", 1<<30)
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 256 << 20}
	p, err := e.alice.Explain(e.ctx(), req)
	if err != nil || len(p.Parts) != 1 {
		t.Fatal(err, p)
	}
	e.lender.set(e.lender.refuse, p.Parts[0].NodeID, true)
	l, err := e.alice.CreateLease(e.ctx(), req)
	if err != nil || l.State != api.LeaseActive || l.NodeID == p.Parts[0].NodeID {
		t.Fatalf("not re-placed within the quota: %v %+v", err, l)
	}
	_, err = e.alice.CreateLease(e.ctx(), req)
	wantQuota(t, err, "holds 1 of 1 leases")
}

// TestRejectionsSayTheirConstraintOnce: an explanation's line names a
// rejected device's constraint once: a reason that starts with the
// constraint's word is not prefixed with it again ("node n1 (node-…) is
// skipped"; it read "node: node n1"); other reasons keep it ("capacity:
// …", "exclusive: lent whole only").
func TestRejectionsSayTheirConstraintOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinSpecs("x", nil, api.DeviceSpec{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "exclusive"})
	j, _ := e.join("n1", 8<<20)
	l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 6 << 20})
	if err != nil || l.NodeID != j.NodeID {
		t.Fatalf("%v %+v", err, l)
	}
	p, err := e.alice.Explain(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	explained := strings.Join(p.Explanation, "\n")
	// A move away from the part's lender skips it.
	_, err = e.alice.MoveLease(e.ctx(), l.ID, api.MoveRequest{})
	var ae *api.Error
	if !errors.As(err, &ae) {
		t.Fatalf("move: %v", err)
	}
	for _, tc := range []struct {
		name, text string
		want, lack []string
	}{
		{"explain", explained, []string{"n1/disk0 (dev-", "): capacity: 2MiB free", "x/disk0 (dev-", "): exclusive: lent whole only"}, nil},
		{"move", ae.Message, []string{"n1/disk0 (dev-", "): node n1 (" + j.NodeID + ") is skipped (it is the part's lender"}, []string{"node: node"}},
	} {
		for _, w := range tc.want {
			if !strings.Contains(tc.text, w) {
				t.Errorf("%s: lacks %q:\n%s", tc.name, w, tc.text)
			}
		}
		for _, w := range tc.lack {
			if strings.Contains(tc.text, w) {
				t.Errorf("%s: says %q:\n%s", tc.name, w, tc.text)
			}
		}
	}
}
