package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pgserver"
)

// children lists the child processes of pid.
func children(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("tasks of %d: %v", pid, err)
	}
	var out []int
	for _, task := range tasks { // a child belongs to the thread that started it
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
	}
	return out
}

// TestUpReplicas: `rialto up --replicas 3` runs three control-plane
// replicas on a throwaway PostgreSQL in the state dir; RIALTO_ADDR lists
// them, and the CLI and the agents carry on when one is SIGKILLed.
func TestUpReplicas(t *testing.T) {
	if _, err := pgserver.FindBin(); err != nil {
		t.Skip(err)
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	t.Cleanup(func() {
		// Also when rialto up was killed: its PostgreSQL must not outlive
		// the test, nor its data directory (under /tmp when run as root).
		if pg, err := pgserver.Attach(filepath.Join(dir, "pg")); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pg.Stop(ctx, "immediate")
			pg.Remove()
		}
	})
	up := startUp(t, bin, dir, "--replicas", "3", "--agents", "2", "--quota", "leases=2")
	addrs := strings.Split(up.Addr, ",")
	if len(addrs) != 3 || !strings.HasPrefix(addrs[0], "https://") {
		t.Fatalf("RIALTO_ADDR=%s", up.Addr)
	}
	if !strings.Contains(up.Output(), "3 control-plane replicas sharing a PostgreSQL") {
		t.Fatalf("banner:\n%s", up.Output())
	}
	var first api.Lease
	up.cli(t, bin, &first, "lease", "create", "--kind", "block", "--size", "16MiB")
	servers := children(t, up.Pid())
	if len(servers) != 3 {
		t.Fatalf("rialto up has %d child processes, want the 3 replicas", len(servers))
	}
	// The first address's replica dies; the CLI moves on to the others.
	if err := syscall.Kill(servers[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var second api.Lease
	up.cli(t, bin, &second, "lease", "create", "--kind", "block", "--size", "16MiB")
	if second.State != api.LeaseActive {
		t.Fatalf("second lease %s", second.State)
	}
	// The quota holds across replicas.
	cmd := exec.Command(bin, "lease", "create", "--kind", "block", "--size", "16MiB")
	cmd.Env = up.Env()
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), api.CodeQuota) {
		t.Fatalf("third lease under leases=2: %v\n%s", err, out)
	}
	// The agents keep heartbeating through the others.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var nodes []api.Node
		up.cli(t, bin, &nodes, "nodes")
		ready := 0
		for _, n := range nodes {
			if n.State == api.NodeReady && time.Since(n.LastHeartbeat) < 3*time.Second {
				ready++
			}
		}
		if ready == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes after the replica died: %+v", nodes)
		}
		time.Sleep(250 * time.Millisecond) // polling with a deadline
	}
	up.Stop(t)
	if _, err := os.Stat(filepath.Join(dir, "pg", "password")); err != nil {
		t.Fatalf("the PostgreSQL of the state dir: %v", err)
	}
}
