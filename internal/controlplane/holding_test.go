package controlplane

import (
	"net/http"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

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
	if x := strings.Join(got.Plan.Explanation, "\n"); !strings.Contains(x, "skipped node "+j1.NodeID) || strings.Contains(x, "borrower") && strings.Contains(x, "is skipped") {
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
