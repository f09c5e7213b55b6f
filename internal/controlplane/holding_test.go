package controlplane

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestLeaseCountAndHeld: a lease's count is the parts it holds, also when
// placement chose to compose by itself, and its held is what they hold —
// a whole device, a dedicated device larger than the size asked for, a
// composed lease's parts rounded up to its stripe unit — while its size
// stays what was asked for. GET and the list say the same as the answer
// to the creation.
func TestLeaseCountAndHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30, 1<<30, 1<<30, 1<<30)
	e.join("n2", 1<<30, 1<<30, 1<<30, 1<<30)
	for _, tc := range []struct {
		name       string
		req        api.LeaseRequest
		mode       api.Mode
		count      int
		size, held int64
	}{
		// No device holds 1.5GiB: placement composes two parts of
		// 768MiB by itself (the request names no count).
		{"composed by placement", api.LeaseRequest{Kind: api.KindBlock, Size: 3 << 29}, api.ModeComposed, 2, 3 << 29, 3 << 29},
		{"dedicated of a size", api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Size: 256 << 20}, api.ModeDedicated, 1, 256 << 20, 1 << 30},
		{"whole device", api.LeaseRequest{Kind: api.KindBlock}, api.ModeDedicated, 1, 0, 1 << 30},
		// Three parts of 103MiB: 322122546/3 rounded up to the 1MiB
		// stripe unit.
		{"composed, rounded up", api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 322122546}, api.ModeComposed, 3, 322122546, 324009984},
	} {
		l, err := e.alice.CreateLease(e.ctx(), tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := e.alice.Lease(e.ctx(), l.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range []api.Lease{l, got} {
			if x.Mode != tc.mode || x.Count != tc.count || len(x.Parts) != tc.count || x.Size != tc.size || x.Held != tc.held {
				t.Errorf("%s: mode %s, count %d (%d parts), size %d, held %d; want %s, %d, size %d, held %d",
					tc.name, x.Mode, x.Count, len(x.Parts), x.Size, x.Held, tc.mode, tc.count, tc.size, tc.held)
			}
		}
	}
	ls, err := e.alice.Leases(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if n, held := api.Holding(l.Parts); l.Count != n || l.Held != held || n == 0 {
			t.Errorf("listed %s: count %d, held %d; its parts: %d, %d", l.ID, l.Count, l.Held, n, held)
		}
	}
}

// TestShareOnlyForAccel: a share sizes a shared accel lease; on any other
// kind it used to be ignored (the lease was created as if none was given).
// It is refused, and nothing is created.
func TestShareOnlyForAccel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	for _, req := range []api.LeaseRequest{
		{Kind: api.KindBlock, Size: 1 << 20, Share: 0.5},
		{Kind: api.KindMemory, Mode: api.ModeShared, Size: 1 << 20, Share: 0.5},
	} {
		_, err := e.alice.CreateLease(e.ctx(), req)
		wantCode(t, err, http.StatusBadRequest, "share applies to shared accel leases only")
		if !api.IsCode(err, api.CodeInvalid) {
			t.Fatalf("%+v: %v, want invalid_request", req, err)
		}
		_, err = e.alice.Explain(e.ctx(), req)
		wantCode(t, err, http.StatusBadRequest, "share applies")
	}
	if ls, _ := e.alice.AllLeases(e.ctx()); len(ls) != 0 {
		t.Fatalf("refused requests left leases: %+v", ls)
	}
}

// TestBorrowerNodeRefusesPrepare: a lease borrowed by a node is placed on
// the node's own device first (nearest of all); when the node refuses to
// prepare it, the node is skipped as a lender, not as the borrower: the
// lease is placed on another lender and the borrower still gets it. (It
// failed with "borrower … is skipped".)
func TestBorrowerNodeRefusesPrepare(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j1, _ := e.join("n1", 1<<30)
	j2, _ := e.join("n2", 1<<30)
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 256 << 20, Borrower: j1.NodeID}
	p, err := e.alice.Explain(e.ctx(), req)
	if err != nil || len(p.Parts) != 1 || p.Parts[0].NodeID != j1.NodeID {
		t.Fatalf("the borrower's own device is not placement's choice: %v %+v", err, p)
	}
	e.lender.set(e.lender.refuse, j1.NodeID, true)
	l, err := e.alice.CreateLease(e.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseActive || l.NodeID != j2.NodeID || l.Borrower != j1.NodeID {
		t.Fatalf("not placed on the other lender: %+v", l)
	}
	got, err := e.alice.Lease(e.ctx(), l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if x := strings.Join(got.Plan.Explanation, "\n"); !strings.Contains(x, "skipped node n1 ("+j1.NodeID+")") || strings.Contains(x, "borrower") && strings.Contains(x, "is skipped") {
		t.Fatalf("explanation:\n%s", x)
	}
	// Every lender refuses: the lease fails, and its reason is about
	// lenders, not the borrower.
	e.lender.set(e.lender.refuse, j2.NodeID, true)
	_, err = e.alice.CreateLease(e.ctx(), req)
	wantCode(t, err, http.StatusServiceUnavailable, "did not confirm")
	if strings.Contains(err.Error(), "borrower") {
		t.Fatalf("the failure blames the borrower: %v", err)
	}
}

// TestNotReadyNodeHealthUnknown: a node's health is its agent's report
// while it is ready; once it is suspect or down its health is unknown (the
// last report, no longer current, is last_health), and a heartbeat makes
// the report current again. Every answer that carries nodes says so.
func TestNotReadyNodeHealthUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j1, n1 := e.join("n1", 1<<30)
	j2, n2 := e.join("n2", 1<<30)
	beat := func(c *api.Client, id, health string) {
		t.Helper()
		if _, err := c.Heartbeat(e.ctx(), id, api.Heartbeat{Health: health}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(state api.NodeState, health, last string) {
		t.Helper()
		n, err := e.alice.Node(e.ctx(), j1.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		ns, err := e.alice.Nodes(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		topo, err := e.alice.Topology(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		for _, list := range [][]api.Node{ns, topo.Nodes} {
			for _, x := range list {
				if x.ID == j1.NodeID && (x.Health != n.Health || x.LastHealth != n.LastHealth) {
					t.Fatalf("listed %+v, got %+v", x, n)
				}
			}
		}
		if n.State != state || n.Health != health || n.LastHealth != last {
			t.Fatalf("node %s, health %q, last health %q; want %s, %q, %q", n.State, n.Health, n.LastHealth, state, health, last)
		}
	}
	beat(n1, j1.NodeID, "ok")
	check(api.NodeReady, "ok", "")
	e.clock.Advance(4 * time.Second) // past SuspectAfter
	beat(n2, j2.NodeID, "ok")
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	check(api.NodeSuspect, api.HealthUnknown, "ok")
	e.clock.Advance(7 * time.Second) // past DownAfter
	beat(n2, j2.NodeID, "ok")
	if err := e.srv.Sweep(e.ctx()); err != nil {
		t.Fatal(err)
	}
	check(api.NodeDown, api.HealthUnknown, "ok")
	beat(n1, j1.NodeID, "disk0: I/O errors")
	check(api.NodeReady, "disk0: I/O errors", "")
}

// TestUnknownRoleInfeasible: every accel device lists the roles it can
// load (attributes.roles); a request for a role no device offers is
// infeasible up front — 422, naming the role and the roles the cluster
// offers, no lease created, no lender asked — as a device constraint no
// device meets is in Kubernetes DRA or Nomad (a device that offers it may
// join later). A role only some devices offer is placed on those.
func TestUnknownRoleInfeasible(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.joinSpecs("n1", nil, api.DeviceSpec{Name: "fpga0", Kind: api.KindAccel, Capacity: 4, Sharing: "partitionable",
		Attributes: map[string]string{"roles": "echo,sha256"}})
	aes := e.joinSpecs("n2", nil, api.DeviceSpec{Name: "fpga0", Kind: api.KindAccel, Capacity: 4, Sharing: "partitionable",
		Attributes: map[string]string{"roles": "aesgcm,echo"}})
	for _, req := range []api.LeaseRequest{
		{Kind: api.KindAccel, Role: "nosuch"},
		{Kind: api.KindAccel, Role: "nosuch", Count: 2},
		{Kind: api.KindAccel, Mode: api.ModeShared, Role: "nosuch"},
	} {
		_, err := e.alice.CreateLease(e.ctx(), req)
		wantCode(t, err, http.StatusUnprocessableEntity, "role nosuch", "roles offered: aesgcm, echo, sha256")
		if !api.IsCode(err, api.CodeInfeasible) {
			t.Fatalf("%+v: %v", req, err)
		}
		p, err := e.alice.Explain(e.ctx(), req)
		if err != nil || p.State != "infeasible" || !strings.Contains(strings.Join(p.Explanation, "\n"), "does not offer role nosuch") {
			t.Fatalf("explain %+v: %v %+v", req, err, p)
		}
	}
	if ls, _ := e.alice.AllLeases(e.ctx()); len(ls) != 0 {
		t.Fatalf("leases created: %+v", ls)
	}
	e.lender.mu.Lock()
	asked := len(e.lender.keys)
	e.lender.mu.Unlock()
	if asked != 0 {
		t.Fatalf("%d lender(s) asked to prepare an unknown role", asked)
	}
	// aesgcm is on n2 only: both leases go there, whichever device
	// placement would otherwise prefer.
	for _, req := range []api.LeaseRequest{
		{Kind: api.KindAccel, Role: "aesgcm"},
		{Kind: api.KindAccel, Mode: api.ModeShared, Role: "aesgcm"},
	} {
		l, err := e.alice.CreateLease(e.ctx(), req)
		if err != nil || l.NodeID != aes {
			t.Fatalf("%+v: %v, on %s, want %s", req, err, l.NodeID, aes)
		}
	}
}
