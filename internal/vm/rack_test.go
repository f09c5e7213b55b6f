package vm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/rack"
	"github.com/rialto-project/rialto/internal/uptest"
	"github.com/rialto-project/rialto/internal/vm"
	"github.com/rialto-project/rialto/internal/vm/vmtest"
)

// TestMoveAcrossRack is cold migration in an emulated rack: a guest boots
// under TCG on node2 (`rialto vm run --detach` in its network namespace)
// from a block lease lent by node1 — its supervisor attaches the lease
// and serves qemu on a Unix socket — and writes its marker; `rialto vm move --to netns:` stops it
// (flushing the disk to the lender) and starts it in node3's namespace
// with the same lease, where the guest finds the marker on its disk.
func TestMoveAcrossRack(t *testing.T) {
	if err := rack.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	g := vmtest.Find(t)
	bin := uptest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, err := rack.Start(ctx, rack.Config{Binary: bin, StateDir: filepath.Join(t.TempDir(), "rack"), Agents: 3, Disks: 1, DiskSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	state := filepath.Join(t.TempDir(), "vms")
	// Whatever happens, no guest outlives the test.
	defer func() {
		recs, _ := vm.ListRecords(state)
		for _, rec := range recs {
			for _, pid := range []int{rec.PID, rec.QEMUPID} {
				if pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	}()
	lender, first, second := r.Agent(0), r.Agent(1), r.Agent(2)
	blk, err := r.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 16 << 20, Affinity: []string{lender.Name}})
	if err != nil {
		t.Fatal(err)
	}
	rialto := func(n *rack.Node, args ...string) ([]byte, error) {
		t.Helper()
		var cmd *exec.Cmd
		if n == nil {
			cmd = exec.CommandContext(ctx, bin, args...)
		} else {
			cmd = r.Command(ctx, *n, bin, args...)
		}
		cmd.Env = append(os.Environ(), r.Env()...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return out, &cmdError{err: err, stderr: stderr.String()}
		}
		return out, nil
	}

	out, err := rialto(&first, "vm", "run", "--disk", blk.ID, "--kernel", g.Kernel, "--initrd", g.Initrd, "--append", vmtest.Append("moved-1"),
		"--accel", "tcg", "--memory", "256MiB", "--name", "guest", "--state-dir", state, "--detach", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rec vm.Record
	if err := json.Unmarshal(out, &rec); err != nil || rec.Host != "netns:"+first.Namespace || rec.Lease != blk.ID || rec.Accel != "tcg" {
		t.Fatalf("vm run: %s (%v)", out, err)
	}
	if cmdline, err := os.ReadFile("/proc/" + itoa(rec.QEMUPID) + "/cmdline"); err != nil || bytes.Contains(cmdline, []byte(export(blk.URI))) {
		t.Errorf("qemu's command line (%v) shows the export name", err)
	}
	if line := vmtest.WaitConsole(t, rec.Console, 0, vmtest.Wrote, 4*time.Minute); line != vmtest.Wrote+" moved-1" {
		t.Fatalf("first boot: %q", line)
	}
	out, err = rialto(nil, "vm", "list", "--state-dir", state, "-o", "json")
	var listed []struct {
		Name, State, Host string
	}
	if err != nil || json.Unmarshal(out, &listed) != nil || len(listed) != 1 || listed[0].State != "running" || listed[0].Host != rec.Host {
		t.Fatalf("vm list: %s %v", out, err)
	}

	// A destination that does not exist is refused before the VM stops.
	if _, err := rialto(nil, "vm", "move", "guest", "--to", "netns:no-such-ns", "--state-dir", state); err == nil ||
		!strings.Contains(err.Error(), "no network namespace no-such-ns") {
		t.Fatalf("move to nowhere: %v", err)
	}
	if cur, err := vm.LoadRecord(state, "guest"); err != nil || !cur.Running() || cur.QEMUPID != rec.QEMUPID {
		t.Fatalf("after the refused move: %+v %v", cur, err)
	}

	before, err := os.Stat(rec.Console)
	if err != nil {
		t.Fatal(err)
	}
	out, err = rialto(nil, "vm", "move", "guest", "--to", "netns:"+second.Namespace, "--state-dir", state, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var mv struct {
		From, To string
		VM       vm.Record
	}
	if err := json.Unmarshal(out, &mv); err != nil || mv.From != rec.Host || mv.To != "netns:"+second.Namespace || mv.VM.Lease != blk.ID {
		t.Fatalf("vm move: %s (%v)", out, err)
	}
	if syscall.Kill(rec.QEMUPID, 0) == nil && bytes.Contains(readFile("/proc/"+itoa(rec.QEMUPID)+"/cmdline"), []byte("guest=guest")) {
		t.Errorf("the first qemu (%d) still runs", rec.QEMUPID)
	}
	// The flushed marker is on the lender.
	dataTLS, err := pki.LoadClientTLS(r.CACert())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nbd.DialURI(ctx, blk.URI, nbd.WithTLS(dataTLS))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 32)
	_, err = nc.ReadAtContext(ctx, got, vmtest.MarkerOffset)
	nc.Close()
	if err != nil || string(bytes.TrimRight(got, "\x00")) != "RIALTO-MARKER:moved-1" {
		t.Fatalf("the lender holds %q (%v)", got, err)
	}
	// The new qemu runs in node3's namespace and finds the marker.
	if ns, err := os.Readlink("/proc/" + itoa(mv.VM.QEMUPID) + "/ns/net"); err != nil || ns != nsOf(t, second.Namespace) {
		t.Errorf("qemu %d in namespace %s (%v), want %s's", mv.VM.QEMUPID, ns, err, second.Name)
	}
	if line := vmtest.WaitConsole(t, mv.VM.Console, before.Size(), vmtest.Found, 4*time.Minute); line != vmtest.Found+" moved-1" {
		t.Fatalf("after the move: %q", line)
	}

	if out, err := rialto(nil, "vm", "stop", "guest", "--state-dir", state); err != nil || strings.TrimSpace(string(out)) != "stopped guest" {
		t.Fatalf("vm stop: %s %v", out, err)
	}
	if _, err := vm.LoadRecord(state, "guest"); err == nil {
		t.Error("the record outlived vm stop")
	}
}

type cmdError struct {
	err    error
	stderr string
}

func (e *cmdError) Error() string { return e.err.Error() + ": " + e.stderr }

func itoa(n int) string { return strconv.Itoa(n) }

func readFile(p string) []byte {
	b, _ := os.ReadFile(p)
	return b
}

func export(uri string) string { return uri[strings.LastIndex(uri, "/")+1:] }

// nsOf is the ns/net link of a named namespace, as /proc/PID/ns/net shows it.
func nsOf(t *testing.T, name string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/run/netns", name), &st); err != nil {
		t.Fatal(err)
	}
	return "net:[" + strconv.FormatUint(st.Ino, 10) + "]"
}
