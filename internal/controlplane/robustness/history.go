package robustness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/rialto-project/rialto/api"
)

// History records operations for the checker. Its methods are safe for
// concurrent use.
type History struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
}

// NewHistory starts a history now.
func NewHistory() *History { return &History{start: time.Now()} }

// never is the return time of an operation without a definitive outcome:
// it may take effect at any time after its call.
const never = math.MaxInt64 / 2

// Add records an operation of client that was called at call and
// returned out at ret.
func (h *History) Add(client int, in Input, call time.Time, out Output, ret time.Time) {
	r := int64(ret.Sub(h.start))
	if out.Result == Unknown {
		r = never
	}
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: int64(call.Sub(h.start)), Output: out, Return: r})
	h.mu.Unlock()
}

// Operations returns a copy of the recorded operations.
func (h *History) Operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}

// Count returns how many operations of kind op ended with result.
func (h *History) Count(op, result string) int {
	n := 0
	for _, o := range h.Operations() {
		if o.Input.(Input).Op == op && o.Output.(Output).Result == result {
			n++
		}
	}
	return n
}

// Check checks the history against m within timeout; on a failure it
// writes porcupine's visualization to vizPath (if not empty).
func Check(m Model, h *History, timeout time.Duration, vizPath string) porcupine.CheckResult {
	pm := m.Porcupine()
	res, info := porcupine.CheckOperationsVerbose(pm, h.Operations(), timeout)
	if res != porcupine.Ok && vizPath != "" {
		porcupine.VisualizePath(pm, info, vizPath)
	}
	return res
}

// Workload is the clients: per tenant, ClientsPerTenant clients that each
// create a lease (with an idempotency key, retried on ambiguous answers),
// read, maybe renew, and release it, over and over, through a client that
// fails over between the replicas' addresses.
type Workload struct {
	Addrs            string            // comma-separated control-plane addresses
	Tokens           map[string]string // tenant → API token
	ClientsPerTenant int
	Size             int64 // bytes per lease
	HTTP             *http.Client
	// RetryFor bounds how long an operation is retried on ambiguous
	// answers before it is recorded as unknown.
	RetryFor time.Duration
}

// Run runs the clients until ctx ends and returns the history, with a
// final read of every lease acknowledged as created (client ID: the
// number of clients).
func (w *Workload) Run(ctx context.Context) *History {
	h := NewHistory()
	var wg sync.WaitGroup
	id := 0
	var mu sync.Mutex
	created := map[string]string{} // lease → tenant
	for tenant, tok := range w.Tokens {
		for range w.ClientsPerTenant {
			c := &client{id: id, tenant: tenant, w: w, h: h, api: api.NewClient(w.Addrs, tok, w.HTTP)}
			id++
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, l := range c.run(ctx) {
					mu.Lock()
					created[l] = c.tenant
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	// Every acknowledged lease is still known, in a state the model allows.
	fctx, cancel := context.WithTimeout(context.Background(), 2*w.RetryFor)
	defer cancel()
	for l, tenant := range created {
		c := &client{id: id, tenant: tenant, w: w, h: h, api: api.NewClient(w.Addrs, w.Tokens[tenant], w.HTTP)}
		c.get(fctx, l)
	}
	return h
}

type client struct {
	id     int
	tenant string
	w      *Workload
	h      *History
	api    *api.Client
	n      int
}

// ambiguous reports an answer that does not tell whether the request was
// carried out: no answer, or a server-side failure.
func ambiguous(err error) bool {
	var ae *api.Error
	return err != nil && (!errors.As(err, &ae) || ae.Status >= 500)
}

// retry calls f until it answers definitively, ctx ends or RetryFor
// passes; the last error is returned.
func (c *client) retry(ctx context.Context, f func(context.Context) error) error {
	deadline := time.Now().Add(c.w.RetryFor)
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(rctx)
		cancel()
		if !ambiguous(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func status(err error) int {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// run is one client's loop; it returns the leases it created.
func (c *client) run(ctx context.Context) []string {
	var mine []string
	for ctx.Err() == nil {
		c.n++
		key := fmt.Sprintf("rb-%d-%d-%d", c.id, c.n, rand.Int64())
		in := Input{Op: OpCreate, Tenant: c.tenant}
		call := time.Now()
		var l api.Lease
		err := c.retry(ctx, func(ctx context.Context) error {
			var err error
			l, err = c.api.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: c.w.Size, IdempotencyKey: key, TTLSeconds: 3600})
			return err
		})
		out := Output{Result: Unknown}
		switch {
		case err == nil && l.State == api.LeaseActive && len(l.Parts) == 1:
			p := l.Parts[0]
			out = Output{Result: Ok, ID: l.ID, State: l.State, Device: p.DeviceID, Off: p.Offset, Len: p.Length}
		case err == nil:
			// A replay of a reservation interrupted by a fault: it is
			// never activated (the sweep fails it). Not acknowledged.
		case !ambiguous(err):
			out = Output{Result: Refused}
		}
		c.h.Add(c.id, in, call, out, time.Now())
		if out.Result != Ok {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(5+rand.IntN(20)) * time.Millisecond):
			}
			continue
		}
		mine = append(mine, l.ID)
		c.get(ctx, l.ID)
		if rand.IntN(2) == 0 {
			c.renew(ctx, l.ID)
		}
		c.release(ctx, l.ID)
		if rand.IntN(3) == 0 {
			c.get(ctx, l.ID)
		}
	}
	return mine
}

func (c *client) get(ctx context.Context, id string) {
	in := Input{Op: OpGet, Tenant: c.tenant, ID: id}
	call := time.Now()
	var l api.Lease
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		l, err = c.api.Lease(ctx, id)
		return err
	})
	out := Output{Result: Unknown}
	switch {
	case err == nil:
		out = Output{Result: Ok, ID: l.ID, State: l.State}
	case status(err) == http.StatusNotFound:
		out = Output{Result: NotFound}
	case !ambiguous(err):
		out = Output{Result: Refused}
	}
	c.h.Add(c.id, in, call, out, time.Now())
}

func (c *client) renew(ctx context.Context, id string) {
	in := Input{Op: OpRenew, Tenant: c.tenant, ID: id}
	call := time.Now()
	err := c.retry(ctx, func(ctx context.Context) error {
		_, err := c.api.RenewLease(ctx, id, 3600)
		return err
	})
	out := Output{Result: Unknown}
	switch {
	case err == nil:
		out = Output{Result: Ok}
	case status(err) == http.StatusNotFound:
		out = Output{Result: NotFound}
	case !ambiguous(err):
		out = Output{Result: Refused}
	}
	c.h.Add(c.id, in, call, out, time.Now())
}

func (c *client) release(ctx context.Context, id string) {
	in := Input{Op: OpRelease, Tenant: c.tenant, ID: id}
	call := time.Now()
	var l api.Lease
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		l, err = c.api.ReleaseLease(ctx, id)
		return err
	})
	out := Output{Result: Unknown}
	switch {
	case err == nil && (l.State == api.LeaseReleased || l.State == api.LeaseReleasing):
		out = Output{Result: Ok, State: l.State}
	case status(err) == http.StatusConflict:
		// Found released: an earlier try did it (ours, or the client's
		// failover to another replica after the answer was lost).
		out = Output{Result: Ok}
	case status(err) == http.StatusNotFound:
		out = Output{Result: NotFound}
	case err != nil && !ambiguous(err):
		out = Output{Result: Refused}
	}
	c.h.Add(c.id, in, call, out, time.Now())
}
