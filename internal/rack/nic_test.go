package rack

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestUplinks: with Uplinks, every agent has wan0 to the outside and lends
// it as a NIC device; the outside answers the agents, not the root
// namespace.
func TestUplinks(t *testing.T) {
	b := needRack(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed")
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox not installed")
	}
	r := startRack(t, Config{Binary: b, StateDir: t.TempDir(), Agents: 2, Borrowers: 1, Uplinks: true, UplinkRate: "100mbit", NICRate: "80mbit"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := r.Outside().Server.String()
	for _, a := range r.Agents() {
		if err := r.Command(ctx, a, "busybox", "ping", "-c", "1", "-W", "2", srv).Run(); err != nil {
			t.Errorf("%s cannot reach the outside: %v", a.Name, err)
		}
	}
	if exec.CommandContext(ctx, "busybox", "ping", "-c", "1", "-W", "1", srv).Run() == nil {
		t.Error("the root namespace reaches the outside without a lent NIC")
	}
	// A borrower's namespace reaches the agents, not the outside.
	bn := r.Borrower(0)
	if bn.Name != "borrower1" || r.Command(ctx, bn, "busybox", "ping", "-c", "1", "-W", "2", r.Agent(0).Addr.String()).Run() != nil {
		t.Errorf("borrower %+v does not reach node1", bn)
	}
	if r.Command(ctx, bn, "busybox", "ping", "-c", "1", "-W", "1", srv).Run() == nil {
		t.Error("a borrower's namespace reaches the outside without a lent NIC")
	}
	var hosts []byte
	if err := r.Do(bn, func() error {
		var err error
		hosts, err = os.ReadFile("/proc/thread-self/net/dev") // this thread's namespace's interfaces
		return err
	}); err != nil || !strings.Contains(string(hosts), bn.Iface) {
		t.Errorf("Do did not run in %s (%v): %s", bn.Namespace, err, hosts)
	}
	devs, err := r.Client().Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nics := 0
	for _, d := range devs {
		if d.Kind == api.KindNIC {
			nics++
			if d.Capacity != 10_000_000 {
				t.Errorf("NIC %s lends %d bytes/s, want 80 Mbit/s", d.Name, d.Capacity)
			}
		}
	}
	if nics != 2 {
		t.Errorf("%d NIC devices in the inventory, want 2: %+v", nics, devs)
	}
	for _, a := range r.Agents() {
		out, _ := r.Command(ctx, a, "nft", "list", "tables").Output()
		if !strings.Contains(string(out), "rialto_nic_") {
			t.Errorf("%s has no lender table: %s", a.Name, out)
		}
	}
}
