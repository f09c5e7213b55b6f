package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestFailover: a client with several addresses skips one that refuses
// connections and one that answers 503, remembers the one that answered,
// and gives every create an idempotency key; with one address it does not
// retry.
func TestFailover(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // connections to it are refused

	var unavailableHits, okHits atomic.Int64
	unavailable := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		unavailableHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(ErrorBody{Error: ErrorInfo{Code: CodeUnavailable, Message: "this control-plane replica cannot reach its database"}})
	}))
	defer unavailable.Close()
	var keys []string
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		okHits.Add(1)
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		json.NewEncoder(w).Encode(Lease{ID: "lease-1", State: LeaseActive})
	}))
	defer ok.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := NewClient(dead+","+unavailable.URL+","+ok.URL, "tok", nil)
	l, err := c.CreateLease(ctx, LeaseRequest{Kind: KindBlock, Size: 1})
	if err != nil || l.ID != "lease-1" {
		t.Fatalf("create: %+v %v", l, err)
	}
	if len(keys) != 1 || keys[0] == "" {
		t.Fatalf("idempotency keys sent: %q", keys)
	}
	if unavailableHits.Load() != 1 {
		t.Fatalf("503 replica asked %d times", unavailableHits.Load())
	}
	if c.BaseURL() != ok.URL {
		t.Fatalf("in use: %s, want %s", c.BaseURL(), ok.URL)
	}
	// The next request goes straight to the replica that answered, also
	// from a new client for the same list.
	if _, err := NewClient(dead+","+unavailable.URL+","+ok.URL, "tok", nil).Lease(ctx, "lease-1"); err != nil {
		t.Fatal(err)
	}
	if unavailableHits.Load() != 1 || okHits.Load() != 2 {
		t.Fatalf("hits: 503 %d, ok %d", unavailableHits.Load(), okHits.Load())
	}

	// Every address failing: the last answer (503) comes back, after
	// going round the list failoverRounds times.
	bad := NewClient(dead+","+unavailable.URL, "tok", nil)
	before := unavailableHits.Load()
	_, err = bad.Lease(ctx, "x")
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable {
		t.Fatalf("all failing: %v", err)
	}
	if n := unavailableHits.Load() - before; n != failoverRounds {
		t.Fatalf("503 replica asked %d times, want %d", n, failoverRounds)
	}

	// One address: no retry.
	before = unavailableHits.Load()
	if _, err := NewClient(unavailable.URL, "tok", nil).Lease(ctx, "x"); err == nil {
		t.Fatal("want the 503")
	}
	if n := unavailableHits.Load() - before; n != 1 {
		t.Fatalf("single address asked %d times", n)
	}
}

// TestPlacementLeader: a client with several addresses sends creations
// and releases to the replica named as the placement leader in an answer
// (PlacementLeaderHeader), other calls to the replica in use; it forgets
// a leader that cannot be reached, or that answers without naming itself,
// and never follows a name that is not one of its own addresses.
func TestPlacementLeader(t *testing.T) {
	type replica struct {
		srv  *httptest.Server
		hits atomic.Int64
		name atomic.Value // the leader it names ("" none)
	}
	var rs [3]*replica
	for i := range rs {
		r := &replica{}
		r.name.Store("")
		r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.hits.Add(1)
			if n := r.name.Load().(string); n != "" && req.Method == http.MethodPost {
				w.Header().Set(PlacementLeaderHeader, n)
			}
			json.NewEncoder(w).Encode(Lease{ID: "lease-1", State: LeaseActive})
		}))
		defer r.srv.Close()
		rs[i] = r
	}
	a, b, c := rs[0], rs[1], rs[2]
	hits := func() [3]int64 { return [3]int64{a.hits.Load(), b.hits.Load(), c.hits.Load()} }
	expect := func(step string, want [3]int64) {
		t.Helper()
		if got := hits(); got != want {
			t.Fatalf("%s: hits %v, want %v", step, got, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Each names C, the leader (A as a forwarding replica would).
	a.name.Store(c.srv.URL + "/")
	c.name.Store(c.srv.URL)
	cl := NewClient(a.srv.URL+","+b.srv.URL+","+c.srv.URL, "tok", nil)
	if _, err := cl.CreateLease(ctx, LeaseRequest{Kind: KindBlock, Size: 1}); err != nil {
		t.Fatal(err)
	}
	expect("first create", [3]int64{1, 0, 0})
	if _, err := cl.ReleaseLease(ctx, "lease-1"); err != nil {
		t.Fatal(err)
	}
	expect("release to the leader", [3]int64{1, 0, 1})
	if _, err := cl.Lease(ctx, "lease-1"); err != nil {
		t.Fatal(err)
	}
	expect("a read to the replica in use", [3]int64{2, 0, 1})
	if _, err := cl.CreateLease(ctx, LeaseRequest{Kind: KindBlock, Size: 1}); err != nil {
		t.Fatal(err)
	}
	expect("create to the leader", [3]int64{2, 0, 2})

	// The leader goes away: the call goes through the list (A, which
	// names B now), and the next one to B.
	a.name.Store(b.srv.URL)
	b.name.Store(b.srv.URL)
	c.srv.Close()
	if _, err := cl.CreateLease(ctx, LeaseRequest{Kind: KindBlock, Size: 1}); err != nil {
		t.Fatal(err)
	}
	expect("the leader gone", [3]int64{3, 0, 2})
	if _, err := cl.ReleaseLease(ctx, "lease-1"); err != nil {
		t.Fatal(err)
	}
	expect("the new leader", [3]int64{3, 1, 2})

	// B no longer leads (nobody is named): the call it answered stands,
	// the next goes to A again.
	a.name.Store("")
	b.name.Store("")
	if _, err := cl.ReleaseLease(ctx, "lease-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReleaseLease(ctx, "lease-1"); err != nil {
		t.Fatal(err)
	}
	expect("no leader named", [3]int64{4, 2, 2})

	// A name outside the list is not followed: the credential stays
	// with the addresses the client was given.
	var foreign atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		foreign.Add(1)
		json.NewEncoder(w).Encode(Lease{ID: "lease-1", State: LeaseActive})
	}))
	defer elsewhere.Close()
	a.name.Store(elsewhere.URL)
	for range 2 {
		if _, err := cl.CreateLease(ctx, LeaseRequest{Kind: KindBlock, Size: 1}); err != nil {
			t.Fatal(err)
		}
	}
	expect("a foreign name", [3]int64{6, 2, 2})
	if foreign.Load() != 0 {
		t.Fatalf("the client called an address it was not given %d times", foreign.Load())
	}

	// One address: the header changes nothing.
	one := NewClient(a.srv.URL, "tok", nil)
	a.name.Store(b.srv.URL)
	for range 2 {
		if _, err := one.CreateLease(ctx, LeaseRequest{Kind: KindBlock, Size: 1}); err != nil {
			t.Fatal(err)
		}
	}
	expect("one address", [3]int64{8, 2, 2})
}

// TestUnanswered: which errors of a request say the control plane did not
// answer it (an idempotent request may be sent again).
func TestUnanswered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := NewClient("http://"+addr, "", &http.Client{Timeout: 5 * time.Second})
	_, refused := c.Leases(context.Background())
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, ctxErr := c.Leases(cancelled)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"a proxy's 502", &Error{Status: http.StatusBadGateway, Code: CodeInternal}, true},
		{"a proxy's 504", &Error{Status: http.StatusGatewayTimeout, Code: CodeInternal}, true},
		{"the control plane's 503", &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable}, false},
		{"the control plane's 409", &Error{Status: http.StatusConflict, Code: CodeConflict}, false},
		{"an untrusted certificate", fmt.Errorf("rialto api: GET /v1/leases: %w: x509", ErrUntrustedServer), false},
		{"the caller cancelled", ctxErr, false},
		{"nil", nil, false},
	} {
		if got := Unanswered(tc.err); got != tc.want {
			t.Errorf("%s (%v): Unanswered = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestFailoverPlainBadRequest: a client with several addresses moves on
// from one that answers a plain 400 (an HTTPS replica given as http://:
// Go's "Client sent an HTTP request to an HTTPS server"), for a request
// and for the event stream, and returns the last such answer when every
// address gave one; a 400 of the API's (its error body) is the request's
// and final: the next address is not asked. Before, the client returned
// the plain 400 of the first address.
func TestFailoverPlainBadRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// http:// to a server that speaks HTTPS only.
	httpsOnly := func() string {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.Errorf("the HTTPS server got a request: %s %s", r.Method, r.URL)
		}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // its handshake errors
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return "http://" + srv.Listener.Addr().String()
	}
	var okHits atomic.Int64
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		okHits.Add(1)
		if r.URL.Path == "/v1/events" {
			w.Header().Set("Content-Type", "application/x-ndjson")
			json.NewEncoder(w).Encode(Event{ID: 1, Type: "lease.created", Subject: "lease-1"})
			return
		}
		json.NewEncoder(w).Encode(Lease{ID: "lease-1", State: LeaseActive})
	}))
	defer ok.Close()
	invalid := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(ErrorBody{Error: ErrorInfo{Code: CodeInvalid, Message: "bad lease id"}})
	}))
	defer invalid.Close()

	plain := httpsOnly()
	c := NewClient(plain+","+ok.URL, "tok", nil)
	if l, err := c.Lease(ctx, "lease-1"); err != nil || l.ID != "lease-1" {
		t.Errorf("a plain 400, then a replica that answers: %+v %v", l, err)
	}
	if c.BaseURL() != ok.URL {
		t.Errorf("in use: %s, want %s", c.BaseURL(), ok.URL)
	}
	// The event stream, on a list of its own (starting at the plain one).
	var got []int64
	err := NewClient(httpsOnly()+","+ok.URL, "tok", nil).FollowEvents(ctx, 0, FollowOptions{Backoff: time.Millisecond}, func(ev Event) error {
		got = append(got, ev.ID)
		return ErrStopFollowing
	})
	if err != nil || len(got) != 1 {
		t.Errorf("following events from a plain 400, then a replica that answers: %v %v", got, err)
	}

	// Every address plain: the last answer, plain.
	for what, c := range map[string]*Client{"a request": NewClient(httpsOnly()+","+httpsOnly(), "tok", nil), "the event stream": NewClient(httpsOnly()+","+httpsOnly(), "tok", nil)} {
		var err error
		if what == "a request" {
			_, err = c.Lease(ctx, "lease-1")
		} else {
			err = c.FollowEvents(ctx, 0, FollowOptions{Backoff: time.Millisecond}, func(Event) error { return nil })
		}
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !ae.Plain || !strings.Contains(ae.Message, "HTTPS server") {
			t.Errorf("%s, every address answering a plain 400: %v, want that 400", what, err)
		}
	}

	// The API's 400: final.
	before := okHits.Load()
	_, err = NewClient(invalid.URL+","+ok.URL, "tok", nil).Lease(ctx, "x")
	if !IsCode(err, CodeInvalid) {
		t.Errorf("the API's 400: %v, want it", err)
	}
	err = NewClient(invalid.URL+","+ok.URL, "tok", nil).FollowEvents(ctx, 0, FollowOptions{Backoff: time.Millisecond}, func(Event) error { return nil })
	if !IsCode(err, CodeInvalid) {
		t.Errorf("the event stream's API 400: %v, want it", err)
	}
	if n := okHits.Load() - before; n != 0 {
		t.Errorf("after the API's 400, the next address was asked %d times", n)
	}
}
