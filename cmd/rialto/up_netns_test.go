package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/rack"
)

// TestUpNetnsRefused: without root, or without ip/tc, `rialto up --netns`
// says so in one line and creates nothing; --link-rate, --uplinks and
// --uplink-rate alone are refused.
func TestUpNetnsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := filepath.Join(t.TempDir(), "state")
	// Usage mistakes exit 2, a refusal to run (no root, no ip) 1.
	run := func(cmd *exec.Cmd, want string) {
		t.Helper()
		code := 2
		if strings.Contains(want, "needs root") || strings.Contains(want, "needs ip(8)") {
			code = 1
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != code {
			t.Fatalf("%v: exit %v, want %d\n%s", cmd.Args, err, code, stderr.String())
		}
		msg := strings.TrimSuffix(stderr.String(), "\n")
		if strings.Contains(msg, "\n") || !strings.Contains(msg, want) {
			t.Errorf("%v: stderr %q, want one line with %q", cmd.Args, msg, want)
		}
	}

	run(exec.Command(bin, "up", "--link-rate", "1gbit", "--state-dir", dir), "--link-rate needs --netns")
	run(exec.Command(bin, "up", "--netns", "--link-rate", "fast", "--state-dir", dir), `invalid argument "fast" for "--link-rate"`)
	run(exec.Command(bin, "up", "--uplinks", "--state-dir", dir), "--uplinks needs --netns")
	run(exec.Command(bin, "up", "--netns", "--uplink-rate", "1gbit", "--state-dir", dir), "--uplink-rate needs --uplinks")

	cmd := exec.Command(bin, "up", "--netns", "--state-dir", dir)
	if os.Geteuid() == 0 {
		// As nobody, who must be able to reach the binary.
		if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		cmd.Dir = "/"
	}
	run(cmd, "rialto up --netns needs root")
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("refused rialto up created its state dir")
	}
	if os.Geteuid() == 0 {
		cmd := exec.Command(bin, "up", "--netns", "--state-dir", dir)
		cmd.Env = append(os.Environ(), "PATH=/nonexistent")
		run(cmd, "rialto up --netns needs ip(8), not found on PATH (install iproute2)")
	}
}

// needNetns skips without root or ip/tc.
func needNetns(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	if err := rack.Available(); err != nil {
		t.Skip(err)
	}
}

// rackRecord reads the lab record of a state dir.
func rackRecord(t *testing.T, dir string) (lab string, reaper int) {
	t.Helper()
	var rec struct {
		Lab    string `json:"lab"`
		Reaper int    `json:"reaper_pid"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "rack.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec.Lab, rec.Reaper
}

// labPids lists the processes inside a lab's namespaces.
func labPids(t *testing.T, id string) []int {
	t.Helper()
	nss, _, err := netns.Leftovers(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, ns := range nss {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(out)) {
			pid, _ := strconv.Atoi(f)
			pids = append(pids, pid)
		}
	}
	return pids
}

// gone reports whether pid has exited (a zombie nobody reaped counts).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// poll waits for cond with a deadline.
func poll(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		<-tick.C
	}
}

func labGone(id string) func() bool {
	return func() bool {
		nss, links, err := netns.Leftovers(context.Background(), id)
		return err == nil && len(nss)+len(links) == 0
	}
}

// TestUpNetns runs `rialto up --netns` as a user would: the banner names
// the namespaces, the env file points at the control plane's namespace
// address, the CLI from this (root) namespace sees the agents ready at
// theirs, a block lease it creates is readable with nbdinfo, offers trim
// and maps as one hole, the links are shaped; SIGTERM removes everything, and a restart on the same state dir
// has the same address and token and still serves the lease.
func TestUpNetns(t *testing.T) {
	needNetns(t)
	bin := buildBinary(t)
	if _, err := exec.LookPath("nbdinfo"); err != nil {
		t.Skip("nbdinfo not installed")
	}
	dir := filepath.Join(t.TempDir(), "state")
	up := startUp(t, bin, dir, "--netns", "--agents", "2", "--link-rate", "1gbit")
	id, _ := rackRecord(t, dir)
	for _, want := range []string{"each a process in its own network namespace, links shaped to 1gbit",
		"rialto-rack-" + id + "-h0", "rialto-rack-" + id + "-h2", "ip netns exec rialto-rack-" + id + "-h1 COMMAND"} {
		if !strings.Contains(up.Output(), want) {
			t.Errorf("banner lacks %q:\n%s", want, up.Output())
		}
	}
	// The env file is written after the lines startUp waits for.
	poll(t, "the env file", 10*time.Second, func() bool {
		env, err := os.ReadFile(filepath.Join(dir, "env"))
		return err == nil && strings.Contains(string(env), "export RIALTO_ADDR="+up.Addr+"\n")
	})
	api0, err := netip.ParseAddrPort(strings.TrimPrefix(up.Addr, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	prefix := netip.PrefixFrom(api0.Addr(), 24).Masked()

	var nodes []api.Node
	up.cli(t, bin, &nodes, "nodes")
	if len(nodes) != 2 {
		t.Fatalf("%d nodes", len(nodes))
	}
	for _, n := range nodes {
		a, err := netip.ParseAddr(n.Address)
		if n.State != api.NodeReady || err != nil || !prefix.Contains(a) || a == api0.Addr() {
			t.Errorf("node %s is %s at %s, want ready in %v", n.Name, n.State, n.Address, prefix)
		}
	}
	for i := range 3 {
		out, err := exec.Command("tc", "qdisc", "show", "dev", "rl"+id+"v"+strconv.Itoa(i)).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "rate 1Gbit") {
			t.Errorf("link %d: %v %s", i, err, out)
		}
	}
	var l api.Lease
	up.cli(t, bin, &l, "lease", "create", "--kind", "block", "--size", "16MiB", "--ttl", "1h")
	// The agents serve TLS (the rack's CA in STATE/tls, libnbd's layout).
	tlsDir := filepath.Join(dir, "tls")
	if !strings.HasPrefix(l.URI, "nbds://") {
		t.Fatalf("block lease of the rack: %s", strings.SplitN(l.URI, "/", 4)[2])
	}
	tlsURI := l.URI + "?tls-certificates=" + tlsDir
	if out, err := exec.Command("nbdinfo", "--size", tlsURI).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "16777216" {
		t.Fatalf("nbdinfo over TLS: %v %s", err, out)
	}
	// The agent process serves the lease with trim, and maps the fresh
	// lease as one hole that reads as zeroes.
	if out, err := exec.Command("nbdinfo", "--can", "trim", tlsURI).CombinedOutput(); err != nil {
		t.Errorf("nbdinfo --can trim: %v %s", err, out)
	}
	if out, err := exec.Command("nbdinfo", "--map", tlsURI).CombinedOutput(); err != nil || strings.Join(strings.Fields(string(out)), " ") != "0 16777216 3 hole,zero" {
		t.Errorf("nbdinfo --map of a fresh lease: %v %q, want one hole,zero extent", err, out)
	}

	up.Stop(t)
	if !labGone(id)() {
		t.Fatalf("lab %s left behind after SIGTERM", id)
	}
	if lab, _ := rackRecord(t, dir); lab != "" {
		t.Errorf("record still names lab %s after a clean stop", lab)
	}

	up2 := startUp(t, bin, dir, "--netns", "--agents", "2", "--link-rate", "1gbit")
	if up2.Addr != up.Addr || up2.Token != up.Token {
		t.Errorf("restart: %s %s, was %s %s", up2.Addr, up2.Token[:8], up.Addr, up.Token[:8])
	}
	var again api.Lease
	up2.cli(t, bin, &again, "lease", "show", l.ID)
	if again.State != api.LeaseActive || again.URI != l.URI {
		t.Fatalf("lease after restart: %s at %s (was %s)", again.State, again.URI, l.URI)
	}
	if out, err := exec.Command("nbdinfo", "--size", l.URI+"?tls-certificates="+tlsDir).CombinedOutput(); err != nil {
		t.Fatalf("nbdinfo after restart: %v %s", err, out)
	}
	up2.Stop(t)
}

// TestUpNetnsCrash SIGKILLs `rialto up --netns`: its reaper removes the
// namespaces, links and processes. Then it SIGKILLs a second run together
// with its reaper: the lab stays behind until a third run on the same state
// dir removes it.
func TestUpNetnsCrash(t *testing.T) {
	needNetns(t)
	bin := buildBinary(t)
	dir := filepath.Join(t.TempDir(), "state")
	args := []string{"--netns", "--agents", "2", "--disks", "1", "--disk-size", "16MiB"}

	up := startUp(t, bin, dir, args...)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "logs", "reaper.log"))
			t.Logf("reaper.log:\n%s", b)
		}
	})
	id, reaper := rackRecord(t, dir)
	pids := labPids(t, id)
	if len(pids) != 3 || gone(reaper) {
		t.Fatalf("lab %s runs %v, reaper %d", id, pids, reaper)
	}
	up.Kill()
	poll(t, "the reaper to remove the lab", 30*time.Second, labGone(id))
	poll(t, "the rack's processes to end", 30*time.Second, func() bool {
		for _, pid := range append(pids, reaper) {
			if !gone(pid) {
				return false
			}
		}
		return true
	})
	poll(t, "the reaper to clear the record", 10*time.Second, func() bool { lab, _ := rackRecord(t, dir); return lab == "" })

	up2 := startUp(t, bin, dir, args...)
	id2, reaper2 := rackRecord(t, dir)
	// With its reaper killed, only the third run removes this lab: if the
	// test stops before, it must not leave the lab's namespaces, links and
	// processes running (Purge of a lab already gone does nothing).
	t.Cleanup(func() {
		if err := netns.Purge(context.Background(), id2, nil); err != nil {
			t.Errorf("purging lab %s: %v", id2, err)
		}
	})
	if id2 == id || up2.Addr != up.Addr {
		t.Errorf("second run: lab %s at %s, first %s at %s", id2, up2.Addr, id, up.Addr)
	}
	if err := syscall.Kill(reaper2, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	up2.Kill()
	poll(t, "the second reaper to end", 10*time.Second, func() bool { return gone(reaper2) })
	if labGone(id2)() || len(labPids(t, id2)) != 3 {
		t.Fatalf("with its reaper killed too, lab %s should still be there", id2)
	}

	up3 := startUp(t, bin, dir, args...)
	if !labGone(id2)() {
		t.Errorf("third run left the second's lab %s", id2)
	}
	id3, _ := rackRecord(t, dir)
	var nodes []api.Node
	up3.cli(t, bin, &nodes, "nodes")
	if len(nodes) != 2 || nodes[0].State != api.NodeReady || nodes[1].State != api.NodeReady {
		t.Errorf("third run's nodes: %+v", nodes)
	}
	up3.Stop(t)
	if !labGone(id3)() {
		t.Errorf("lab %s left after SIGTERM", id3)
	}
}

// TestRackTableGolden pins the namespace table of `rialto up --netns`.
func TestRackTableGolden(t *testing.T) {
	var b bytes.Buffer
	nodes := []rack.Node{
		{Name: "controlplane", Namespace: "rialto-rack-0a1b2c-h0", Addr: netip.MustParseAddr("10.213.7.2"), RootIface: "rl0a1b2cv0", Rate: "1gbit"},
		{Name: "node1", Namespace: "rialto-rack-0a1b2c-h1", Addr: netip.MustParseAddr("10.213.7.3"), RootIface: "rl0a1b2cv1", Rate: "1gbit"},
		{Name: "node2", Namespace: "rialto-rack-0a1b2c-h2", Addr: netip.MustParseAddr("10.213.7.4"), RootIface: "rl0a1b2cv2"},
	}
	printRackNodes(&b, nodes, "10.213.7.1", "/srv/rialto-state/logs")
	path := filepath.Join("testdata", "rack.golden")
	if *rewrite {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run RackTableGolden -rewrite)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("rack table changed (go test -run RackTableGolden -rewrite to accept):\n%s", b.String())
	}
}
