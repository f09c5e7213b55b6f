package main

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/rack"
)

// TestAccelReadsBlockLeaseOnAnotherLender is devices reading devices
// across an emulated rack: `rialto accel run --input-lease`, run on node3
// (the borrower), has the accelerator slot on node2 hash 64 MiB of a block
// lease on node1, and the digest is sha256sum's of the same bytes. The
// link counters show the path: directly, 64 MiB leave node1 and enter
// node2 and next to nothing crosses the borrower's link; relayed
// (--relay), the 64 MiB cross the borrower's link twice, in and out.
func TestAccelReadsBlockLeaseOnAnotherLender(t *testing.T) {
	needNetns(t)
	bin := buildBinary(t)
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("sha256sum not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := rack.Start(ctx, rack.Config{Binary: bin, StateDir: filepath.Join(t.TempDir(), "rack"), Agents: 3,
		Disks: 1, DiskSize: 128 << 20, AccelSlots: 1, AgentArgs: []string{"--slot-memory", "72MiB"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	lender, appl, borrower := r.Agent(0), r.Agent(1), r.Agent(2)
	cl := r.Client()
	blk, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 80 << 20, Affinity: []string{lender.Name}})
	if err != nil {
		t.Fatal(err)
	}
	acc, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256", Affinity: []string{appl.Name}})
	if err != nil {
		t.Fatal(err)
	}
	if blk.NodeID == acc.NodeID {
		t.Fatalf("both leases on %s", blk.NodeID)
	}

	// 64 MiB of random bytes, at 8 MiB into the block lease.
	src := filepath.Join(t.TempDir(), "range.bin")
	data := make([]byte, 64<<20)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum, err := exec.Command("sha256sum", src).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Fields(string(sum))[0]
	dataTLS, err := r.DataTLS()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nbd.DialURI(ctx, blk.URI, nbd.WithTLS(dataTLS))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.WriteAtContext(ctx, data, 8<<20, true); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	counters := func() []netns.Counters {
		var cs []netns.Counters
		for _, n := range []rack.Node{lender, appl, borrower} {
			c, err := r.Counters(n)
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
		}
		return cs
	}
	const mib = 1 << 20
	for _, relay := range []bool{false, true} {
		args := []string{"accel", "run", acc.ID, "sha256", "--input-lease", blk.ID + ":8MiB:64MiB", "--hex"}
		if relay {
			args = append(args, "--relay")
		}
		before := counters()
		cmd := r.Command(ctx, borrower, bin, args...)
		cmd.Env = append(os.Environ(), r.Env()...)
		out, err := cmd.Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("relay=%v: %v: %s", relay, err, stderr)
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Fatalf("relay=%v: the slot's digest %s, sha256sum's %s", relay, got, want)
		}
		after := counters()
		d := func(i int) (in, out int64) {
			return after[i].ToHost - before[i].ToHost, after[i].FromHost - before[i].FromHost
		}
		_, lOut := d(0)
		aIn, _ := d(1)
		bIn, bOut := d(2)
		t.Logf("relay=%v: lender sent %.1f MiB, appliance received %.1f MiB, borrower received %.1f MiB and sent %.1f MiB",
			relay, float64(lOut)/mib, float64(aIn)/mib, float64(bIn)/mib, float64(bOut)/mib)
		if lOut < 64*mib || aIn < 64*mib {
			t.Errorf("relay=%v: the 64 MiB did not go from the lender (%d B) to the appliance (%d B)", relay, lOut, aIn)
		}
		if !relay && bIn+bOut > 2*mib {
			t.Errorf("direct: %d B crossed the borrower's link", bIn+bOut)
		}
		if relay && (bIn < 64*mib || bOut < 64*mib) {
			t.Errorf("relay: the borrower's link carried %d B in and %d B out, want the range both ways", bIn, bOut)
		}
	}
	// The appliance never logged the block lease's credential.
	applLog, err := os.ReadFile(appl.Log)
	if err != nil {
		t.Fatal(err)
	}
	if export := blk.URI[strings.LastIndex(blk.URI, "/")+1:]; strings.Contains(string(applLog), export) {
		t.Error("the appliance's node logged the block lease's export name")
	}
}
