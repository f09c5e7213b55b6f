package api

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
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
