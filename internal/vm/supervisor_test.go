package vm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/uptest"
	"github.com/rialto-project/rialto/internal/vm"
	"github.com/rialto-project/rialto/internal/vm/vmtest"
)

// TestOneSupervisorPerVM: of two `rialto vm run --detach` of one name and
// one-part disk started at once, one runs the guest and the other is
// refused, naming the first (without the VM's lock both booted the same
// disk, and `vm stop` then stopped only the one the record named). A
// supervisor SIGKILLed with a composed disk leaves its disk socket behind;
// the next `vm run` of the name replaces it and runs (it was refused with
// "address already in use").
func TestOneSupervisorPerVM(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	g := vmtest.Find(t)
	bin := uptest.Binary(t)
	up := uptest.StartUp(t, bin, filepath.Join(t.TempDir(), "up"), "--agents", "2", "--disks", "1", "--disk-size", "32MiB")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	single, err := up.Client(t).CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	composed, err := up.Client(t).CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(single.Parts) != 1 || len(composed.Parts) != 2 {
		t.Fatalf("leases of %d and %d parts, want 1 and 2", len(single.Parts), len(composed.Parts))
	}
	state := filepath.Join(t.TempDir(), "vms")
	// Whatever happens, no guest outlives the test: every supervisor and
	// qemu a run reported, or a record names.
	var mu sync.Mutex
	var pids []int
	defer func() {
		recs, _ := vm.ListRecords(state)
		for _, rec := range recs {
			pids = append(pids, rec.PID, rec.QEMUPID)
		}
		for _, pid := range pids {
			if pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
	run := func(name string, blk api.Lease) (vm.Record, string, error) {
		cmd := exec.CommandContext(ctx, bin, "vm", "run", "--disk", blk.ID, "--kernel", g.Kernel, "--initrd", g.Initrd,
			"--append", vmtest.Append("one"), "--accel", "tcg", "--memory", "128MiB", "--name", name, "--state-dir", state, "--detach", "-o", "json")
		cmd.Env = up.Env()
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var rec vm.Record
		if err == nil {
			if err = json.Unmarshal(out, &rec); err == nil {
				mu.Lock()
				pids = append(pids, rec.PID, rec.QEMUPID)
				mu.Unlock()
			}
		}
		return rec, stderr.String(), err
	}

	type result struct {
		rec    vm.Record
		stderr string
		err    error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			rec, stderr, err := run("single", single)
			results <- result{rec, stderr, err}
		}()
	}
	var ran []vm.Record
	var refused []string
	for range 2 {
		r := <-results
		if r.err == nil {
			ran = append(ran, r.rec)
		} else {
			refused = append(refused, r.stderr)
		}
	}
	if len(ran) != 1 || len(refused) != 1 {
		t.Fatalf("two `vm run` of one name at once: %d ran %+v, %d refused %q; want one each", len(ran), ran, len(refused), refused)
	}
	if want := fmt.Sprintf("VM single is supervised by another `rialto vm run` (pid %d", ran[0].PID); !strings.Contains(refused[0], want) {
		t.Errorf("the refused run says %q, want %q", refused[0], want)
	}

	first, stderr, err := run("composed", composed)
	if err != nil {
		t.Fatalf("vm run: %v: %s", err, stderr)
	}

	// The supervisor dies without cleaning up: its qemu follows (its
	// parent-death signal), its record and disk socket stay.
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for first.Running() {
		if time.Now().After(deadline) {
			t.Fatalf("supervisor %d or qemu %d still runs a minute after the supervisor's SIGKILL", first.PID, first.QEMUPID)
		}
		<-tick.C
	}
	second, stderr, err := run("composed", composed)
	if err != nil {
		t.Fatalf("vm run after its supervisor was killed: %v: %s", err, stderr)
	}
	if second.QEMUPID == first.QEMUPID || !second.Running() {
		t.Fatalf("second run: %+v", second)
	}
	for _, name := range []string{"single", "composed"} {
		stop := exec.CommandContext(ctx, bin, "vm", "stop", name, "--state-dir", state)
		if out, err := stop.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "stopped "+name {
			t.Errorf("vm stop %s: %v: %s", name, err, out)
		}
	}
}
