package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
)

// A gateway batches several borrowers' requests into one execution; one
// borrower's bad item must fail its own request only, not the others'
// that shared the execution.
func TestBadItemFailsOnlyItsRequest(t *testing.T) {
	ctx := context.Background()
	key := []byte("0123456789abcdef")
	for _, tc := range []struct {
		name  string
		role  roles.Spec
		entry string
		good  []byte
		bad   []byte
	}{
		{"aesgcm short input", roles.Spec{Name: "aesgcm", Config: key}, "seal", append(make([]byte, 12), "hello"...), []byte("short")},
		{"matmul bad header", roles.Spec{Name: "matmul"}, "mul", make([]byte, 12), []byte{1, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := roles.New(ctx, tc.role)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close(ctx)
			want, err := roles.RunBatch(ctx, r, tc.entry, [][]byte{tc.good}, 0)
			if err != nil {
				t.Fatal(err)
			}
			// Three requests, dispatched together when the third arrives.
			g := run(t, Config{MaxBatch: 3, MaxQueueDelay: time.Hour, Clock: newFakeClock()}, Local(r))
			type res struct {
				out []byte
				err error
			}
			call := func(in []byte) chan res {
				ch := make(chan res, 1)
				go func() {
					out, err := g.Call(ctx, tc.entry, in)
					ch <- res{out, err}
				}()
				return ch
			}
			a, b := call(tc.good), call(tc.bad)
			waitFor(t, func() bool { return g.received.Load() == 2 })
			c := call(tc.good)
			for i, ch := range []chan res{a, c} {
				got := <-ch
				if got.err != nil {
					t.Errorf("good request %d failed because of another's bad item: %v", i, got.err)
				} else if string(got.out) != string(want[0]) {
					t.Errorf("good request %d: wrong output", i)
				}
			}
			if got := <-b; !errors.Is(got.err, roles.ErrBadInput) {
				t.Errorf("bad request: %v, want %v", got.err, roles.ErrBadInput)
			}
		})
	}
}

// poisonBackend records every batch, holds each until gate is closed, and
// fails a batch holding the input "bad" with ErrBadInput.
type poisonBackend struct {
	batches chan []string
	gate    chan struct{}
}

func (p poisonBackend) CallBatch(ctx context.Context, _ string, ins [][]byte) ([][]byte, error) {
	var names []string
	for _, in := range ins {
		names = append(names, string(in))
	}
	p.batches <- names
	<-p.gate
	for _, n := range names {
		if n == "bad" {
			return nil, fmt.Errorf("%w: %s", roles.ErrBadInput, n)
		}
	}
	return ins, nil
}

// A request whose caller has gone (its context cancelled: the caller gave
// up, or its lease was revoked and its connection closed) is not run again
// when its batch fails on another caller's item.
func TestBadItemRetrySkipsCancelledRequests(t *testing.T) {
	p := poisonBackend{batches: make(chan []string, 16), gate: make(chan struct{})}
	g := run(t, Config{MaxBatch: 2, MaxQueueDelay: time.Hour, Clock: newFakeClock()}, p)
	gctx, gone := context.WithCancel(context.Background())
	goodDone := make(chan error, 1)
	go func() {
		_, err := g.Call(gctx, "e", []byte("good"))
		goodDone <- err
	}()
	waitFor(t, func() bool { return g.received.Load() == 1 })
	badDone := make(chan error, 1)
	go func() {
		_, err := g.Call(context.Background(), "e", []byte("bad"))
		badDone <- err
	}()
	if got := <-p.batches; len(got) != 2 {
		t.Fatalf("first batch %v", got)
	}
	gone()
	if err := <-goodDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	close(p.gate)
	if err := <-badDone; !errors.Is(err, roles.ErrBadInput) {
		t.Fatalf("bad request: %v", err)
	}
	for len(p.batches) > 0 {
		if got := <-p.batches; slices.Contains(got, "good") {
			t.Fatalf("the cancelled request ran again: %v", got)
		}
	}
}
