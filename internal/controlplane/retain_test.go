package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestHistoryRetention: a tenant's released leases, their idempotency
// keys and their events disappear once the retention has passed since
// they ended, and not before; a live lease and a lease whose lenders
// still tear it down (releasing) are never pruned; a cursor below the
// pruned events is answered 410 gone, not skipped.
func TestHistoryRetention(t *testing.T) {
	t.Parallel()
	const retain = 7 * 24 * time.Hour
	e := newEnv(t, func(c *Config) { c.RetainHistory, c.MaxTTL = retain, 60*24*time.Hour })
	ctx := e.ctx()
	j, node := e.join("n1", 1<<30)
	// A sweep as the server runs it, after the node's heartbeat (so that
	// its silence never makes its leases lost).
	sweep := func(report ...string) api.HeartbeatResponse {
		t.Helper()
		resp, err := node.Heartbeat(ctx, j.NodeID, api.Heartbeat{Health: "ok", Leases: report})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.srv.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	live, err := e.alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, TTLSeconds: int64((50 * 24 * time.Hour).Seconds())})
	if err != nil {
		t.Fatal(err)
	}
	var released []string
	for i := range 5 {
		l, err := e.alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, IdempotencyKey: fmt.Sprint("key-", i)})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := e.alice.ReleaseLease(ctx, l.ID); err != nil || r.State != api.LeaseReleased {
			t.Fatalf("release: %v %v", r.State, err)
		}
		released = append(released, l.ID)
	}
	// A release the control plane did not finish (it stopped while the
	// lender tore the lease down and wiped it): the lease is releasing.
	wiping, err := e.alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.st.TransitionLease(ctx, wiping.ID, store.LeaseChange{From: []api.LeaseState{api.LeaseActive}, To: api.LeaseReleasing, At: e.clock.Now()},
		api.Event{At: e.clock.Now(), Type: "lease.releasing", Subject: wiping.ID}); err != nil {
		t.Fatal(err)
	}
	evs, err := e.alice.Events(ctx, 0)
	if err != nil || len(evs) == 0 {
		t.Fatalf("events: %v %v", len(evs), err)
	}
	firstEvent := evs[0].ID

	// The sweep's retention duty alone (a whole sweep would finish the
	// interrupted release).
	prune := func() {
		t.Helper()
		if _, err := node.Heartbeat(ctx, j.NodeID, api.Heartbeat{Health: "ok"}); err != nil {
			t.Fatal(err)
		}
		if err := e.srv.pruneHistory(ctx, e.clock.Now()); err != nil {
			t.Fatal(err)
		}
	}

	// Within the retention nothing goes.
	e.clock.Advance(retain - time.Minute)
	prune()
	for _, id := range append([]string{live.ID, wiping.ID}, released...) {
		if _, err := e.alice.Lease(ctx, id); err != nil {
			t.Fatalf("lease %s within the retention: %v", id, err)
		}
	}
	if _, err := e.alice.Events(ctx, firstEvent); err != nil {
		t.Fatalf("events within the retention: %v", err)
	}

	// Past it, the released leases and their events go; the lease still
	// being torn down stays.
	e.clock.Advance(2 * time.Minute)
	prune()
	// The newest event stays whatever its age (event IDs only grow).
	tail, err := e.admin.Events(ctx, 0)
	if err != nil || len(tail) == 0 {
		t.Fatalf("events: %v %v", len(tail), err)
	}
	newest := tail[len(tail)-1].ID
	if l, err := e.alice.Lease(ctx, wiping.ID); err != nil || l.State != api.LeaseReleasing {
		t.Fatalf("the lease being torn down past the retention: %v %v", l.State, err)
	}
	sweep() // finishes the interrupted release: the lease ends now
	if l, err := e.alice.Lease(ctx, wiping.ID); err != nil || l.State != api.LeaseReleased {
		t.Fatalf("the interrupted release: %v %v", l.State, err)
	}
	for _, id := range released {
		if _, err := e.alice.Lease(ctx, id); !isStatus(err, http.StatusNotFound) {
			t.Errorf("released lease %s past the retention: %v", id, err)
		}
	}
	for _, id := range []string{live.ID, wiping.ID} {
		if _, err := e.alice.Lease(ctx, id); err != nil {
			t.Errorf("lease %s must stay: %v", id, err)
		}
	}
	all, err := e.admin.AllLeases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all {
		if slices.Contains(released, l.ID) {
			t.Errorf("the listing still has pruned lease %s", l.ID)
		}
	}
	kept, err := e.admin.Events(ctx, 0)
	if err != nil || len(kept) == 0 {
		t.Fatalf("events kept: %v %v", len(kept), err)
	}
	for _, ev := range kept {
		if slices.Contains(released, ev.Subject) {
			t.Errorf("an event of a pruned lease is left: %+v", ev)
		}
		if ev.At.Before(e.clock.Now().Add(-retain)) && ev.ID != newest {
			t.Errorf("an event older than the retention is left: %+v", ev)
		}
	}
	// A cursor below the pruned events: 410, naming where to resume.
	_, err = e.alice.Events(ctx, firstEvent)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusGone || ae.Code != api.CodeGone || !regexp.MustCompile(`resume from since=\d+`).MatchString(ae.Message) {
		t.Fatalf("events since a pruned cursor: %v", err)
	}
	resp, err := e.ts.Client().Do(mustReq(t, e, "/v1/events?follow=1&since="+fmt.Sprint(firstEvent)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGone {
		t.Fatalf("a follow from a pruned cursor: %d", resp.StatusCode)
	}
	if _, err := e.alice.Events(ctx, kept[0].ID-1); err != nil {
		t.Fatalf("events from the oldest kept: %v", err)
	}
	// The pruned lease's key is forgotten: a retry creates a new lease.
	again, err := e.alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, IdempotencyKey: "key-0"})
	if err != nil || again.ID == released[0] {
		t.Fatalf("a creation with a pruned lease's key: %v %v", again.ID, err)
	}
	// A lender that still reports a pruned lease tears it down.
	if resp := sweep(released[1]); !slices.Contains(resp.Teardown, released[1]) {
		t.Fatalf("heartbeat reporting a pruned lease: teardown %v", resp.Teardown)
	}

	// The finished release ages out in its turn; the live lease stays.
	e.clock.Advance(retain + time.Minute)
	sweep(live.ID)
	if _, err := e.alice.Lease(ctx, wiping.ID); !isStatus(err, http.StatusNotFound) {
		t.Errorf("the finished release past the retention: %v", err)
	}
	if l, err := e.alice.Lease(ctx, live.ID); err != nil || l.State != api.LeaseActive {
		t.Errorf("the live lease: %v %v", l.State, err)
	}
}

// TestRetainZeroKeepsForever: RetainHistory 0 prunes nothing.
func TestRetainZeroKeepsForever(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := e.ctx()
	e.join("n1", 1<<30)
	l, err := e.alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(365 * 24 * time.Hour)
	e.srv.Sweep(ctx) // the node is down by now; its errors do not matter
	if _, err := e.alice.Lease(ctx, l.ID); err != nil {
		t.Fatalf("a released lease with no retention: %v", err)
	}
}

// TestLeasePaging: GET /v1/leases pages with limit and after (the Link
// header); following the pages lists every lease exactly once, even with
// leases created between the pages, and the client reads every page.
func TestLeasePaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := e.ctx()
	e.join("n1", 1<<30)
	var want []string
	for i := range 8 {
		l, err := e.alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if _, err := e.alice.ReleaseLease(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
		}
		if i%2 == 0 {
			e.clock.Advance(time.Second) // some leases share a creation time
		}
		want = append(want, l.ID)
	}
	if _, err := e.bob.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	next := regexp.MustCompile(`^<(/v1/leases\?[^>]*)>; rel="next"$`)
	seen := map[string]int{}
	path := "/v1/leases?limit=3"
	for pages := 0; path != ""; pages++ {
		if pages > 10 {
			t.Fatal("the pages do not end")
		}
		req := mustReq(t, e, path)
		resp, err := (&http.Client{Transport: e.schema}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page []api.Lease
		err = decodeJSON(resp, &page)
		if err != nil || resp.StatusCode != http.StatusOK || len(page) > 3 {
			t.Fatalf("page %s: %d, %d leases, %v", path, resp.StatusCode, len(page), err)
		}
		for _, l := range page {
			seen[l.ID]++
		}
		path = ""
		if m := next.FindStringSubmatch(resp.Header.Get("Link")); m != nil {
			path = m[1]
		} else if len(page) == 3 {
			t.Fatalf("a full page without a Link header: %q", resp.Header.Get("Link"))
		}
		if pages == 1 {
			// A lease created between the pages comes later, once.
			l, err := e.alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, l.ID)
		}
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("lease %s listed %d times", id, seen[id])
		}
	}
	if len(seen) != len(want) {
		t.Errorf("%d leases listed, want %d (alice's only)", len(seen), len(want))
	}
	all, err := e.alice.AllLeases(ctx)
	if err != nil || len(all) != len(want) {
		t.Fatalf("AllLeases: %d %v", len(all), err)
	}
	for _, bad := range []string{"limit=0", "limit=1001", "after=x", "after=12"} {
		resp, err := (&http.Client{Transport: e.schema}).Do(mustReq(t, e, "/v1/leases?"+bad))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, resp.StatusCode)
		}
	}
}

func mustReq(t *testing.T, e *env, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(e.ctx(), http.MethodGet, e.ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+aliceTok)
	return req
}

func isStatus(err error, status int) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Status == status
}

func decodeJSON(resp *http.Response, v any) error {
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
