package slurm_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/slurm"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// attempts is a real HTTP transport that reports each request it sends
// that got no answer.
type attempts struct {
	base   http.RoundTripper
	notify chan struct{} // a value after each failed request, if there is room
}

func (a *attempts) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := a.base.RoundTrip(r)
	if err != nil {
		select {
		case a.notify <- struct{}{}:
		default:
		}
	}
	return resp, err
}

// TestPrologAndEpilogRideOutControlPlaneRestart: a control plane that is
// down for a moment (restarted for an upgrade) failed every job whose
// prolog ran then (the lease creation's connection was refused) and
// drained the node of every job with devices whose epilog ran then. The
// prolog and the epilog now send their idempotent requests again until
// it answers, within their timeout.
func TestPrologAndEpilogRideOutControlPlaneRestart(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := &attempts{base: http.DefaultTransport.(*http.Transport).Clone(), notify: make(chan struct{}, 1)}
	t.Cleanup(tr.base.(*http.Transport).CloseIdleConnections)
	cl := api.NewClient(c.URL, testcluster.AdminToken, &http.Client{Transport: tr, Timeout: 10 * time.Second})
	j := slurm.Job{Cluster: "hpc", ID: "7", UID: 1000, GID: 1000}
	req := []api.LeaseRequest{{Kind: api.KindBlock, Size: 4 << 20}}

	// outage runs f with the control plane down until f has been refused
	// twice, then starts it again; f must then succeed.
	outage := func(what string, f func() error) {
		t.Helper()
		c.StopControlPlane()
		errc := make(chan error, 1)
		go func() { errc <- f() }()
		for n := 0; n < 2; n++ {
			select {
			case <-tr.notify:
			case err := <-errc:
				c.StartControlPlane()
				t.Fatalf("%s with the control plane down ended before it came back: %v", what, err)
			case <-ctx.Done():
				t.Fatalf("%s: %v", what, ctx.Err())
			}
		}
		c.StartControlPlane()
		if err := <-errc; err != nil {
			t.Fatalf("%s across a control-plane restart: %v", what, err)
		}
	}

	var ls []api.Lease
	outage("the prolog", func() (err error) { ls, err = slurm.Ensure(ctx, cl, j, req); return err })
	if len(ls) != 1 || ls[0].State != api.LeaseActive {
		t.Fatalf("the prolog's leases: %+v", ls)
	}
	var released []string
	outage("the epilog", func() (err error) { released, err = slurm.Release(ctx, cl, j); return err })
	if len(released) != 1 || released[0] != ls[0].ID {
		t.Fatalf("the epilog released %v; want %s", released, ls[0].ID)
	}
	if l := c.Lease(ls[0].ID); l.State != api.LeaseReleased {
		t.Errorf("lease %s after the epilog: %s", l.ID, l.State)
	}

	// A control plane that stays down fails the prolog once its time is
	// up, saying so.
	c.StopControlPlane()
	defer c.StartControlPlane()
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	_, err := slurm.Ensure(short, cl, slurm.Job{Cluster: "hpc", ID: "8", UID: 1000, GID: 1000}, req)
	if err == nil || !api.Unanswered(err) {
		t.Fatalf("the prolog with the control plane down for good: %v; want an error saying it did not answer", err)
	}
	t.Logf("the prolog with the control plane down: %v", err)
}
