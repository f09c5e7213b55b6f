package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pgserver"
	"github.com/rialto-project/rialto/internal/pki"
)

// environ is the environment a process was started with, as its user
// (or root) reads it in /proc/PID/environ.
func environ(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatalf("environ of %d: %v", pid, err)
	}
	return string(bytes.ReplaceAll(b, []byte{0}, []byte{'\n'}))
}

// descendants lists the processes below pid, children first.
func descendants(t *testing.T, pid int) []int {
	t.Helper()
	var out []int
	for _, c := range children(t, pid) {
		out = append(out, c)
		out = append(out, descendants(t, c)...)
	}
	return out
}

// TestAgentChildGetsNoSecretEnv: a lender of a NIC runs nft(8) at start,
// and nft was given the agent's whole environment, its bootstrap token
// (and the operator's API token) among it. The nft on PATH here is a
// script that records the environment it was started with, then runs the
// real one.
func TestAgentChildGetsNoSecretEnv(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an agent in a network namespace")
	}
	realNFT, err := exec.LookPath("nft")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and nft(8)")
	}
	for _, tool := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip(tool + " not found")
		}
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	wrap := filepath.Join(dir, "bin")
	record := filepath.Join(dir, "nft.env")
	if err := os.MkdirAll(wrap, 0o700); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\ntr '\\0' '\\n' < /proc/$$/environ > " + record + ".tmp && mv " + record + ".tmp " + record + "\nexec " + realNFT + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(wrap, "nft"), []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	const (
		boot = "rbt_child-env-bootstrap-0123456789"
		user = "rat_child-env-operator-0123456789"
	)
	cmd := exec.Command("unshare", "-n", "sh", "-c", `ip link set lo up && ip link add d0 type veth peer name d1 &&
ip link set d0 up && ip link set d1 up && ip addr add 10.9.0.1/24 dev d0 &&
exec "$0" agent --addr https://127.0.0.1:1 --insecure-dataplane --nic wan=d0 --state-dir "$1" --listen 127.0.0.1`,
		bin, filepath.Join(dir, "state"))
	cmd.Env = append(os.Environ(), "PATH="+wrap+":"+os.Getenv("PATH"), "RIALTO_BOOTSTRAP_TOKEN="+boot, "RIALTO_TOKEN="+user)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
	}()
	deadline := time.Now().Add(30 * time.Second)
	var env []byte
	for env == nil {
		env, _ = os.ReadFile(record)
		select {
		case err := <-done:
			done <- err
			if env == nil {
				t.Fatalf("the agent exited before it ran nft: %v\n%s", err, out.String())
			}
		case <-time.After(20 * time.Millisecond):
		}
		if env == nil && time.Now().After(deadline) {
			t.Fatalf("the agent did not run nft within 30s:\n%s", out.String())
		}
	}
	if !bytes.Contains(env, []byte("PATH=")) {
		t.Fatalf("nft's recorded environment looks empty:\n%s", env)
	}
	for what, s := range map[string]string{"the bootstrap token": boot, "the operator's API token": user} {
		if bytes.Contains(env, []byte(s)) {
			t.Errorf("nft was started with %s in its environment", what)
		}
	}
	// The agent itself had it (it joins with it): the test gave it.
	if !strings.Contains(environ(t, cmd.Process.Pid), boot) {
		t.Errorf("the agent's own environment lacks its bootstrap token: the test is not testing")
	}
}

// TestUpReplicasChildrenGetOnlyTheirSecrets: `rialto up --replicas`
// started PostgreSQL and the replicas with its whole environment: the
// operator's RIALTO_TOKEN (from the shell that sourced STATE/env) went to
// PostgreSQL and to every replica, which need none of it. A replica is
// given its own secrets (database URL, bootstrap and admin tokens) by
// name, in the environment, and none on its command line.
func TestUpReplicasChildrenGetOnlyTheirSecrets(t *testing.T) {
	if testing.Short() {
		t.Skip("runs rialto up with PostgreSQL")
	}
	if _, err := pgserver.FindBin(); err != nil {
		t.Skip(err)
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	t.Cleanup(func() {
		if pg, err := pgserver.Attach(filepath.Join(dir, "pg")); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pg.Stop(ctx, "immediate")
			pg.Remove()
		}
	})
	const shellToken = "rat_operator-shell-token-0123456789"
	t.Setenv("RIALTO_TOKEN", shellToken)
	up := startUp(t, bin, dir, "--replicas", "2", "--agents", "1")
	pg, err := pgserver.Attach(filepath.Join(dir, "pg"))
	if err != nil {
		t.Fatal(err)
	}
	pidFile, err := os.ReadFile(filepath.Join(pg.DataDir(), "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pgPid, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	st, err := loadUpState(dir)
	if err != nil {
		t.Fatal(err)
	}
	password, err := os.ReadFile(filepath.Join(dir, "pg", "password"))
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"the operator's token": shellToken, "the bootstrap token": st.BootstrapToken,
		"the admin token": st.AdminToken, "the metrics token": st.MetricsToken, "the database password": strings.TrimSpace(string(password))}
	replicas := replicaPids(t, up.Pid())
	if len(replicas) != 2 {
		t.Fatalf("rialto up has %d replica processes, want 2", len(replicas))
	}
	// Its other child, the reaper, needs no secret either.
	for _, pid := range children(t, up.Pid()) {
		if slices.Contains(replicas, pid) {
			continue
		}
		env, args := environ(t, pid), cmdline(t, pid)
		for what, s := range secrets {
			if strings.Contains(env, s) || strings.Contains(args, s) {
				t.Errorf("rialto up's child %d (%q) was given %s", pid, args, what)
			}
		}
	}
	for _, pid := range replicas {
		env, args := environ(t, pid), cmdline(t, pid)
		if strings.Contains(env, shellToken) {
			t.Errorf("replica %d was given the operator's RIALTO_TOKEN", pid)
		}
		if !strings.Contains(env, "RIALTO_BOOTSTRAP_TOKEN="+st.BootstrapToken) {
			t.Errorf("replica %d lacks its bootstrap token: the test is not testing", pid)
		}
		for what, s := range secrets {
			if strings.Contains(args, s) {
				t.Errorf("replica %d has %s on its command line", pid, what)
			}
		}
	}
	for _, pid := range append([]int{pgPid}, descendants(t, pgPid)...) {
		env := environ(t, pid)
		for what, s := range secrets {
			if strings.Contains(env, s) {
				t.Errorf("PostgreSQL process %d was started with %s in its environment", pid, what)
			}
		}
	}
	if !strings.Contains(environ(t, up.Pid()), shellToken) {
		t.Errorf("rialto up's own environment lacks the operator's token: the test is not testing")
	}
}

// TestSecretFilesReadableByOthersRefused: a token file, the Slurm hooks'
// env file or an appliance's management token file that every user of
// the machine may read was used as it was; each is now refused with the
// chmod that fixes it, without the secret in the message, and a file of
// its owner and group (root:rialto 0640) still works.
func TestSecretFilesReadableByOthersRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	bin := buildBinary(t)
	const tok = "rat_world-readable-token-0123456789"
	dir := t.TempDir()
	fileOf := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	runBin := func(env []string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	unreachable := "https://127.0.0.1:1"
	for _, tc := range []struct {
		name string
		mode os.FileMode
		env  []string
		args func(file string) []string
		text string
	}{
		{"client token file", 0o644, []string{"RIALTO_ADDR=" + unreachable},
			func(f string) []string { return []string{"nodes", "--token-file", f} }, tok + "\n"},
		{"client token file, other-writable", 0o602, []string{"RIALTO_ADDR=" + unreachable},
			func(f string) []string { return []string{"nodes", "--token-file", f} }, tok + "\n"},
		{"server bootstrap token file", 0o604, nil,
			func(f string) []string {
				return []string{"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--bootstrap-token-file", f}
			}, tok + "\n"},
		{"server tenant token file", 0o644, nil,
			func(f string) []string {
				return []string{"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--token-file", f}
			}, tok + ":alice\n"},
		{"agent bootstrap token file", 0o644, []string{"RIALTO_ADDR=" + unreachable},
			func(f string) []string {
				return []string{"agent", "--insecure-dataplane", "--state-dir", filepath.Join(dir, "agent"), "--bootstrap-token-file", f}
			}, tok + "\n"},
		{"appliance management token file", 0o644, []string{"RIALTO_ADDR=" + unreachable, "RIALTO_BOOTSTRAP_TOKEN=rbt_x-0123456789abcdef"},
			func(f string) []string {
				return []string{"appliance", "--insecure-dataplane", "--state-dir", filepath.Join(dir, "appliance"), "--management-token-file", f}
			}, tok + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fileOf(strings.ReplaceAll(tc.name, " ", "-"), tc.text, tc.mode)
			out, err := runBin(tc.env, tc.args(f)...)
			if err == nil {
				t.Fatalf("accepted a secret file of mode %04o:\n%s", tc.mode, out)
			}
			if !strings.Contains(out, "chmod o-rwx "+f) {
				t.Errorf("the refusal does not say how to fix it:\n%s", out)
			}
			if strings.Contains(out, tok) {
				t.Errorf("the refusal shows the secret:\n%s", out)
			}
		})
	}

	// The group's (root:rialto 0640) is the operator's choice: used.
	f := fileOf("group-token", tok+"\n", 0o640)
	out, err := runBin([]string{"RIALTO_ADDR=" + unreachable}, "nodes", "--token-file", f)
	if err == nil || strings.Contains(out, "chmod") || !strings.Contains(out, "127.0.0.1:1") {
		t.Errorf("a 0640 token file: want the unreachable control plane as the error, got %v:\n%s", err, out)
	}

	// The Slurm prolog records why the job's devices could not be leased
	// (it exits 0 so that the node is not drained); the task prolog fails
	// the job with it.
	envFile := fileOf("slurm.env", "RIALTO_ADDR="+unreachable+"\nRIALTO_TOKEN="+tok+"\n", 0o644)
	spool := filepath.Join(dir, "spool")
	slurmEnv := []string{"SLURM_JOB_ID=42", "SLURM_JOB_UID=0", "SLURM_CLUSTER_NAME=c1", "SLURM_JOB_COMMENT=rialto: block 1GiB"}
	out, err = runBin(slurmEnv, "slurm", "prolog", "--env-file", envFile, "--state-dir", spool)
	if err != nil || strings.Contains(out, tok) {
		t.Fatalf("prolog: %v:\n%s", err, out)
	}
	job, err := os.ReadFile(filepath.Join(spool, "c1-42.env"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(job), "chmod 600") || strings.Contains(string(job), tok) {
		t.Errorf("the job's file: want the env file refused, without its token:\n%s", job)
	}
}

// TestCAKeyReadableByOthersRefused: a CA directory restored with the key
// readable by everyone (cp without -p, a tar extracted under umask 022)
// was used as it was: every user of the machine could sign certificates
// the cluster trusts. The server now refuses to start and says the chmod.
func TestCAKeyReadableByOthersRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	if _, err := pki.Open(tlsDir, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(tlsDir, pki.CAKeyFile)
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--tls-dir", tlsDir)
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("the server ran with a CA key of mode 0644 (%v):\n%s", err, out)
	}
	if !strings.Contains(string(out), "chmod 600 "+key) {
		t.Errorf("the refusal does not say how to fix it:\n%s", out)
	}
	if err := os.Chmod(key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Open(tlsDir, pki.Options{}); err != nil {
		t.Errorf("the CA of mode 0600 again: %v", err)
	}
}
