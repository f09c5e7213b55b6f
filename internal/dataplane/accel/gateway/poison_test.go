package gateway

import (
	"context"
	"errors"
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
