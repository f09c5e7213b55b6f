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

// replicaPids lists the child processes of pid that are `rialto server`
// replicas (not its reaper).
func replicaPids(t *testing.T, pid int) []int {
	t.Helper()
	var out []int
	for _, c := range children(t, pid) {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(c) + "/cmdline"); err == nil && strings.Contains(string(b), "\x00server\x00") {
			out = append(out, c)
		}
	}
	return out
}

// postmaster is the pid of the PostgreSQL server of pgDir (its
// postmaster.pid), or 0.
func postmaster(pgDir string) int {
	pg, err := pgserver.Attach(pgDir)
	if err != nil {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(pg.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// TestUpReplicasKilled SIGKILLs `rialto up --replicas 2`: its replicas end
// with it (they outlived it, kept running and joined the next run's
// election on the same database), its reaper stops its PostgreSQL, and a
// second run on the state dir starts at once (waiting for the reaper if
// it has not finished) and serves.
func TestUpReplicasKilled(t *testing.T) {
	if _, err := pgserver.FindBin(); err != nil {
		t.Skip(err)
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	pgDir := filepath.Join(dir, "pg")
	var leftover []int
	t.Cleanup(func() {
		for _, pid := range leftover {
			if !gone(pid) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if pg, err := pgserver.Attach(pgDir); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pg.Stop(ctx, "immediate")
			pg.Remove()
		}
	})
	up := startUp(t, bin, dir, "--replicas", "2", "--agents", "1")
	servers := replicaPids(t, up.Pid())
	pm := postmaster(pgDir)
	if len(servers) != 2 || pm == 0 || gone(pm) {
		t.Fatalf("rialto up runs replicas %v and PostgreSQL %d", servers, pm)
	}
	leftover = servers
	up.Kill()
	poll(t, "the killed rialto up's replicas and PostgreSQL to end", 30*time.Second, func() bool {
		for _, pid := range append(servers, pm) {
			if !gone(pid) {
				return false
			}
		}
		return true
	})

	up2 := startUp(t, bin, dir, "--replicas", "2", "--agents", "1")
	var nodes []api.Node
	poll(t, "node1 ready", 30*time.Second, func() bool {
		up2.cli(t, bin, &nodes, "nodes")
		return len(nodes) == 1 && nodes[0].State == api.NodeReady
	})
	servers2 := replicaPids(t, up2.Pid())
	leftover = append(leftover, servers2...)
	up2.Stop(t)
	for _, pid := range append(servers2, postmaster(pgDir)) {
		if pid != 0 && !gone(pid) {
			t.Errorf("process %d outlived rialto up's SIGTERM", pid)
		}
	}
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
	servers := replicaPids(t, up.Pid())
	if len(servers) != 3 {
		t.Fatalf("rialto up has %d replica processes, want 3", len(servers))
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
