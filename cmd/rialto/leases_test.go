package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestLeasesLiveByDefault: `rialto leases` asks the server for live leases
// only; --all (or -a) asks for the whole history.
func TestLeasesLiveByDefault(t *testing.T) {
	now := time.Now()
	live := api.Lease{ID: "lease-live", State: api.LeaseActive, Kind: api.KindBlock, CreatedAt: now}
	ended := api.Lease{ID: "lease-ended", State: api.LeaseReleased, Kind: api.KindBlock, CreatedAt: now.Add(-time.Minute)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/nodes":
			json.NewEncoder(w).Encode([]api.Node{})
		case r.URL.Path == "/v1/leases" && r.URL.Query().Get("live") == "1":
			json.NewEncoder(w).Encode([]api.Lease{live})
		case r.URL.Path == "/v1/leases" && !r.URL.Query().Has("live") && !r.URL.Query().Has("after"): // one page
			json.NewEncoder(w).Encode([]api.Lease{ended, live})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args       []string
		want, lack []string
	}{
		{[]string{"leases"}, []string{"lease-live"}, []string{"lease-ended"}},
		{[]string{"leases", "-o", "json"}, []string{"lease-live"}, []string{"lease-ended"}},
		{[]string{"leases", "--all"}, []string{"lease-live", "lease-ended", "released"}, nil},
		{[]string{"leases", "-a", "-o", "json"}, []string{"lease-live", "lease-ended"}, nil},
	} {
		out, errs, code := runCLI(t, srv.URL, tc.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out)
			}
		}
		for _, l := range tc.lack {
			if strings.Contains(out, l) {
				t.Errorf("%v: output has %q:\n%s", tc.args, l, out)
			}
		}
	}
}

// TestLeaseCreateSaysWhatItHolds: a new user's walkthrough against a
// cluster of real agents. A block lease too large for one device is
// composed by placement: its count is its parts and its held what they
// hold, in -o json and in the lease table; --share on a block lease and
// an accelerator role no device offers are refused before any lender is
// asked, with messages that name no package.
func TestLeaseCreateSaysWhatItHolds(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 2, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "accel0", Kind: api.KindAccel, Size: 2, Attributes: map[string]string{"slot_memory": "1MiB"}},
	}})
	rt := t.TempDir()
	out, errs, code := runIn(t, c, rt, "lease", "create", "--kind", "block", "--size", "12MiB", "-o", "json")
	if code != 0 {
		t.Fatalf("lease create: exit %d: %s", code, errs)
	}
	var l api.Lease
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	if l.Mode != api.ModeComposed || l.Count != 2 || len(l.Parts) != 2 || l.Size != 12<<20 || l.Held != 12<<20 {
		t.Fatalf("mode %s, count %d, %d parts, size %d, held %d; want composed, 2, 2, 12MiB, 12MiB", l.Mode, l.Count, len(l.Parts), l.Size, l.Held)
	}
	out, errs, code = runIn(t, c, rt, "leases")
	if code != 0 {
		t.Fatalf("leases: exit %d: %s", code, errs)
	}
	var row []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[0] == l.ID {
			row = f
		}
	}
	// Its NODE and DEVICE are its parts', not only the first part's (the
	// API's node_id and device_id).
	nodes := c.NodeByID(l.Parts[0].NodeID).Name + "," + c.NodeByID(l.Parts[1].NodeID).Name
	if len(row) < 8 || row[4] != "12MiB" || row[5] != "2" || row[6] != nodes || row[7] != "2" || row[8] != "devices" {
		t.Fatalf("the lease's row %q, want SIZE 12MiB, COUNT 2, NODE %s and DEVICE 2 devices:\n%s", row, nodes, out)
	}
	// lease show names every node and device, and each part's.
	out, errs, code = runIn(t, c, rt, "lease", "show", l.ID)
	if code != 0 {
		t.Fatalf("lease show: exit %d: %s", code, errs)
	}
	want := []string{"Nodes:  " + strings.ReplaceAll(nodes, ",", ", "), "Devices:  " + l.Parts[0].DeviceID + ", " + l.Parts[1].DeviceID}
	for i, p := range l.Parts {
		want = append(want, fmt.Sprintf("%d  %s  %s", i, c.NodeByID(p.NodeID).Name, p.DeviceID))
	}
	squeezed := regexp.MustCompile(` {2,}`).ReplaceAllString(out, "  ")
	for _, w := range want {
		if !strings.Contains(squeezed, w) {
			t.Errorf("lease show lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "Node:") || strings.Contains(out, "Device:") {
		t.Errorf("lease show of a composed lease names one node or device:\n%s", out)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"lease", "create", "--kind", "block", "--size", "1MiB", "--share", "0.5"},
			[]string{"share applies to shared accel leases only", "invalid_request", "HTTP 400"}},
		{[]string{"lease", "create", "--kind", "accel", "--role", "nosuch"},
			[]string{"role nosuch", "roles offered: ", "infeasible", "HTTP 422"}},
	} {
		_, errs, code := runIn(t, c, rt, tc.args...)
		if code == 0 {
			t.Fatalf("%v: succeeded", tc.args)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%v: %q lacks %q", tc.args, errs, w)
			}
		}
		for _, pkg := range []string{"controlplane:", "placement:", "store:"} {
			if strings.Contains(errs, pkg) {
				t.Errorf("%v: %q names %s", tc.args, errs, pkg)
			}
		}
	}
	ls, err := c.Client().AllLeases(t.Context())
	if err != nil || len(ls) != 1 {
		t.Fatalf("refused requests left leases: %v %+v", err, ls)
	}
}

// TestLeasesFilters: `rialto leases --tenant T --kind K` lists what the
// control plane selects; an unknown kind is refused with its words.
func TestLeasesFilters(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Tenants: []string{"alice"}})
	ctx := context.Background()
	mine, err := c.ClientWithToken(testcluster.TenantToken("alice")).CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rt := t.TempDir()
	ids := func(args ...string) []string {
		t.Helper()
		out, errs, code := runIn(t, c, rt, append([]string{"leases", "-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("leases %v: exit %d: %s", args, code, errs)
		}
		var ls []api.Lease
		if err := json.Unmarshal([]byte(out), &ls); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, l := range ls {
			ids = append(ids, l.ID)
		}
		return ids
	}
	if got := ids("--tenant", "alice"); len(got) != 1 || got[0] != mine.ID {
		t.Errorf("--tenant alice: %v; want %s (not %s)", got, mine.ID, other.ID)
	}
	if got := ids("--kind", "memory"); len(got) != 0 {
		t.Errorf("--kind memory: %v", got)
	}
	if got := ids("--kind", "block", "--all"); len(got) != 2 {
		t.Errorf("--kind block --all: %v", got)
	}
	if _, errs, code := runIn(t, c, rt, "leases", "--kind", "gpu"); code == 0 || !strings.Contains(errs, `kind="gpu" is not one of`) {
		t.Errorf("--kind gpu: exit %d: %s", code, errs)
	}
}

// TestPartsSayWhichAreLost: lease show of a bond that lost a lender says
// which part is lost (its URI is served by no one); a lease whose parts
// are all served has no STATE column.
func TestPartsSayWhichAreLost(t *testing.T) {
	parts := []api.Part{
		{NodeID: "node-a", DeviceID: "dev-a", Length: 6_250_000, URI: "rialto-nics://10.0.0.3:1/x", State: api.PartLost},
		{NodeID: "node-b", DeviceID: "dev-b", Length: 6_250_000, URI: "rialto-nics://10.0.0.4:1/y"},
	}
	names := map[string]string{"node-a": "n1", "node-b": "n2"}
	var b strings.Builder
	printParts(&b, api.KindNIC, parts, true, names)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "STATE") ||
		!strings.Contains(lines[1], "n1") || !strings.Contains(lines[1], " lost ") ||
		!strings.Contains(lines[2], "n2") || !strings.Contains(lines[2], " served ") {
		t.Fatalf("parts of a bond that lost n1:\n%s", b.String())
	}
	parts[0].State = ""
	b.Reset()
	printParts(&b, api.KindNIC, parts, true, names)
	if strings.Contains(b.String(), "STATE") || strings.Contains(b.String(), "served") {
		t.Fatalf("parts all served:\n%s", b.String())
	}
}

// TestLimitsInFlagTerms: a request over one of the control plane's limits
// (its maximum TTL, a lease's largest size) is refused in the terms of
// the flag that asked for it, as given: "--ttl 100000h is more than the
// maximum 720h", not "ttl_seconds 360000000 is more than the maximum
// 2592000"; lease create, explain and lease renew alike.
func TestLimitsInFlagTerms(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	l, err := c.Client().CreateLease(context.Background(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rt := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lease", "create", "--size", "1MiB", "--ttl", "100000h"}, "--ttl 100000h is more than the maximum 720h (code invalid_request, HTTP 400)"},
		{[]string{"explain", "--size", "1MiB", "--ttl", "360000000"}, "--ttl 360000000 is more than the maximum 720h (code invalid_request, HTTP 400)"},
		{[]string{"lease", "renew", l.ID, "--ttl", "100000h"}, "--ttl 100000h is more than the maximum 720h (code invalid_request, HTTP 400)"},
		{[]string{"lease", "create", "--size", "2EiB"}, "--size 2EiB is more than the maximum 1EiB (code invalid_request, HTTP 400)"},
		{[]string{"lease", "create", "--size", "1MiB", "--stripe-unit", "2TiB"}, "--stripe-unit 2TiB is more than the maximum 1TiB (code invalid_request, HTTP 400)"},
		{[]string{"explain", "--size", "1MiB", "--deadline", "300000h"}, "--deadline 300000h is more than the maximum 277777h46m40s (code invalid_request, HTTP 400)"},
	} {
		_, errs, code := runIn(t, c, rt, tc.args...)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want 1 and %q", tc.args, code, errs, tc.want)
		}
	}
}

// TestLimitsInFlagTermsBelowZero: the API's "must be between 0 and N"
// refuses a value below 0 as well as one above N: only the latter is
// said as "more than the maximum"; the former keeps the API's words.
func TestLimitsInFlagTermsBelowZero(t *testing.T) {
	for _, tc := range []struct {
		value float64
		want  string
	}{
		{-5, "ttl_seconds must be between 0 and 2592000"},
		{3600000, "--ttl 1000h is more than the maximum 720h"},
	} {
		err := flagTerms(&api.Error{Status: 400, Code: api.CodeInvalid, Message: "ttl_seconds must be between 0 and 2592000"},
			fieldFlag{"ttl_seconds", "--ttl", "1000h", tc.value, durationText})
		if ae, ok := err.(*api.Error); !ok || ae.Message != tc.want {
			t.Errorf("ttl_seconds %v refused: %v, want %q", tc.value, err, tc.want)
		}
	}
}

// TestTableDurations: the tables' durations (EXPIRES IN, LAST HEARTBEAT,
// the links' MEASURED) read short and stably, to the nearest of their
// last unit: whole seconds under an hour, minutes under a day, hours
// beyond, a carry into the next unit included. Before, EXPIRES IN was
// Go's duration ("76h10m0s", "2h5m12s") and "ago" Go's rounded to one
// unit ("12m0s ago").
func TestTableDurations(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		d          time.Duration
		until, ago string
	}{
		{0, "0s", "0s ago"},
		{42400 * time.Millisecond, "42s", "42s ago"},
		{59*time.Second + 600*time.Millisecond, "1m00s", "1m00s ago"},
		{12*time.Minute + 3*time.Second, "12m03s", "12m03s ago"},
		{59*time.Minute + 58123456*time.Microsecond, "59m58s", "59m58s ago"},
		{59*time.Minute + 59*time.Second + 600*time.Millisecond, "1h00m", "1h00m ago"},
		{2*time.Hour + 5*time.Minute + 12*time.Second, "2h05m", "2h05m ago"},
		{23*time.Hour + 59*time.Minute + 40*time.Second, "1d0h", "1d0h ago"},
		{76*time.Hour + 10*time.Minute, "3d4h", "3d4h ago"},
		{30 * 24 * time.Hour, "30d0h", "30d0h ago"},
	} {
		if got := until(now, now.Add(tc.d)); got != tc.until {
			t.Errorf("until %v: %q, want %q", tc.d, got, tc.until)
		}
		if got := ago(now, now.Add(-tc.d)); got != tc.ago {
			t.Errorf("ago %v: %q, want %q", tc.d, got, tc.ago)
		}
	}
	if got := until(now, now.Add(-time.Second)); got != "expired" {
		t.Errorf("until a second ago: %q, want expired", got)
	}
	if got := ago(now, now.Add(90*time.Second)); got != "in 1m30s" {
		t.Errorf("ago, 90s ahead: %q, want in 1m30s", got)
	}
	if until(now, time.Time{}) != "-" || ago(now, time.Time{}) != "-" {
		t.Errorf("a zero time: %q %q, want -", until(now, time.Time{}), ago(now, time.Time{}))
	}
}
