package main

import (
	"context"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/rack"
)

// TestNICLeaseFollowsLenderScheme: a lender restarted with the other
// --insecure-dataplane setting serves its tunnel under the other scheme
// (rialto-nic:// for rialto-nics://, and back), and its lease's URI
// changes with it. `rialto attach` holding the lease redials it with the
// lease's current URI, read from the control plane, and the lent NIC
// carries traffic again without restarting attach: it failed every
// redial with the URI it was started with.
func TestNICLeaseFollowsLenderScheme(t *testing.T) {
	// The agents' last flag, changed before each restart (the rack's
	// Config.AgentArgs are appended to the agent's command line at every
	// start, and the rack keeps this slice).
	dataplane := []string{"--insecure-dataplane=false"}
	n := newNICRack(t, rack.Config{Agents: 1, Borrowers: 1, AgentArgs: dataplane})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b := n.r.Borrower(0)
	server := n.r.Outside().Server.String()
	if n.ping(b, server) {
		t.Fatal("the outside answers the borrower before any attach: the test proves nothing")
	}
	l := n.create(ctx, "--kind", "nic", "--bandwidth", "24Mbit/s")
	checkNICTLS(t, l)
	a := n.attach(ctx, b, l.ID, "rnic0")
	if !n.ping(b, server) {
		t.Fatalf("no ping through the lent NIC: %s", a.log())
	}

	for _, tlsOn := range []bool{false, true} {
		dataplane[0] = "--insecure-dataplane=true"
		if tlsOn {
			dataplane[0] = "--insecure-dataplane=false"
		}
		if err := n.r.RestartAgent(ctx, 0); err != nil {
			t.Fatal(err)
		}
		poll(t, "the lease's URI to follow its lender's scheme", 60*time.Second, func() bool {
			cur, err := n.r.Client().Lease(ctx, l.ID)
			if err != nil {
				return false
			}
			uris, err := borrower.NICURIs(cur)
			return err == nil && len(uris) == 1 && uris[0].TLS == tlsOn
		})
		poll(t, "a ping through the lent NIC after its lender's restart (tls "+map[bool]string{true: "on", false: "off"}[tlsOn]+")", 60*time.Second, func() bool {
			select {
			case <-a.done:
				t.Fatalf("attach ended: %s", a.log())
			default:
			}
			return n.ping(b, server)
		})
	}
	n.detach(ctx, a, l.ID)
}
