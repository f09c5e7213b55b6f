package storetest

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// testReplaceParts: a reserved lease's parts are swapped for new ones
// under the same checks as a creation, its plan replaced; the old range
// is free afterwards; a refusal leaves the lease as it was.
func testReplaceParts(t *testing.T, o Options) {
	ctx := context.Background()
	s := open(t, o)
	node, dev := oneNode(t, s, 100)
	for _, l := range []api.Lease{lease("a", "t", node, dev, 0, 20), lease("b", "t", node, dev, 50, 20)} {
		if _, err := s.CreateLease(ctx, l, store.Demand{}, nil, api.Event{}); err != nil {
			t.Fatal(err)
		}
	}
	before, err := s.Lease(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Add(time.Minute).Truncate(time.Microsecond)
	part := func(off, length int64) []api.Part {
		return []api.Part{{NodeID: node, DeviceID: dev, Offset: off, Length: length}}
	}
	for _, c := range []struct {
		name  string
		id    string
		parts []api.Part
		want  error
	}{
		{"overlaps b", "a", part(60, 20), store.ErrCapacity},
		{"outside the device", "a", part(90, 20), store.ErrCapacity},
		{"unknown lease", "zz", part(20, 10), store.ErrNotFound},
	} {
		if _, err := s.ReplaceParts(ctx, c.id, c.parts, nil, at, api.Event{Type: "lease.replaced", Subject: c.id}); !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if got, err := s.Lease(ctx, "a"); err != nil || !reflect.DeepEqual(got, before) {
		t.Fatalf("refused replacements changed the lease:\n%+v\nwas\n%+v (%v)", got, before, err)
	}

	// Placed again on two parts: the lease's count and held are its new
	// parts' (not the creation's).
	two := append(part(20, 15), part(35, 15)...)
	plan := &api.Plan{State: "feasible", Mode: api.ModeDedicated, At: at, Explanation: []string{"placed again"}, Parts: two}
	var last int64
	if evs, err := s.Events(ctx, 0, 1000, ""); err != nil {
		t.Fatal(err)
	} else if len(evs) > 0 {
		last = evs[len(evs)-1].ID
	}
	out, err := s.ReplaceParts(ctx, "a", two, plan, at, api.Event{Type: "lease.replaced", Subject: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if out.State != api.LeaseReserved || out.Mode != api.ModeDedicated || !out.UpdatedAt.Equal(at) ||
		len(out.Parts) != 2 || out.Parts[0].Offset != 20 || out.Parts[1].Length != 15 || out.Plan == nil || out.Plan.Explanation[0] != "placed again" {
		t.Fatalf("replaced: %+v", out)
	}
	if out.Count != 2 || out.Held != 30 {
		t.Fatalf("replaced on two parts of 15: count %d, held %d; want 2 and 30", out.Count, out.Held)
	}
	if got, err := s.Lease(ctx, "a"); err != nil || !reflect.DeepEqual(got, out) {
		t.Fatalf("read back\n%+v\nreturned\n%+v (%v)", got, out, err)
	}
	if evs, err := s.Events(ctx, last, 10, ""); err != nil || len(evs) != 1 || evs[0].Type != "lease.replaced" {
		t.Fatalf("events %+v (%v)", evs, err)
	}
	// The old range is free, the new one taken.
	if _, err := s.CreateLease(ctx, lease("c", "t", node, dev, 0, 20), store.Demand{}, nil, api.Event{}); err != nil {
		t.Fatalf("old range not freed: %v", err)
	}
	if _, err := s.CreateLease(ctx, lease("d", "t", node, dev, 40, 5), store.Demand{}, nil, api.Event{}); !errors.Is(err, store.ErrCapacity) {
		t.Fatalf("new range not taken: %v", err)
	}
	// Only a requested or reserved lease is placed again.
	if _, err := s.TransitionLease(ctx, "b", store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive, At: at, URIs: []string{"nbd://x/b"}}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReplaceParts(ctx, "b", part(80, 10), nil, at, api.Event{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("active lease placed again: %v", err)
	}
	// A lease read after a transition and a replacement is the row's.
	if _, err := s.TransitionLease(ctx, "a", store.LeaseChange{From: []api.LeaseState{api.LeaseReserved}, To: api.LeaseActive, At: at, URIs: []string{"nbd://x/a"}}, api.Event{}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Lease(ctx, "a")
	if err != nil || got.State != api.LeaseActive || got.Parts[0].Offset != 20 || got.Parts[0].URI != "nbd://x/a" {
		t.Fatalf("after activation: %+v (%v)", got, err)
	}
}
