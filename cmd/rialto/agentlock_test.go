package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestAgentProcessHoldsStateDirAndDevice runs `rialto agent` processes on
// one machine: while one lends a device file, a second one on the same
// file with another state directory (the same agent started from another
// working directory), and one on the same state directory, exit at once
// with an error naming the path and the first agent's PID, and the
// tenant's bytes stay readable through the first. SIGKILLed, the first
// leaves nothing behind that stops it: started again on its state
// directory, it serves the lease again, its bytes intact.
func TestAgentProcessHoldsStateDirAndDevice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	secrets := []string{"RIALTO_BOOTSTRAP_TOKEN=boot-secret", "RIALTO_ADMIN_TOKEN=admin-secret"}
	_, url := startProc(t, bin, secrets, "rialto server: serving ",
		"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--tls-dir", filepath.Join(dir, "tls"),
		"--heartbeat", "200ms", "--log-level", "warn")
	caFile := filepath.Join(dir, "tls", "ca-cert.pem")
	env := append(secrets, "RIALTO_ADDR="+url, "RIALTO_CACERT="+caFile)
	disk := filepath.Join(dir, "disk0.img")
	state := filepath.Join(dir, "a1")
	agentArgs := func(stateDir string) []string {
		return []string{"agent", "--name", "a1", "--state-dir", stateDir, "--block", "disk0=" + disk + ":8MiB",
			"--insecure-dataplane", "--log-level", "warn"}
	}

	hc, err := api.HTTPClient(caFile, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(url, "admin-secret", hc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	readySince := func(since time.Time) {
		t.Helper()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			ns, err := cl.Nodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ns) == 1 && ns[0].State == api.NodeReady && ns[0].LastHeartbeat.After(since) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("agent not ready: %v", ns)
			case <-tick.C:
			}
		}
	}
	first, _ := startProc(t, bin, env, "", agentArgs(state)...)
	readySince(time.Time{})
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	pattern := bytes.Repeat([]byte("tenant bytes "), (8<<20)/13+1)[:8<<20]
	nc, err := nbd.DialURI(ctx, l.URI)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.WriteAtContext(ctx, pattern, 0, true); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	// intact reads the lease whole through its URI, once its export
	// answers (a restarted agent serves it once the control plane has
	// confirmed it), and compares it with what was written.
	intact := func() bool {
		t.Helper()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			nc, err := nbd.DialURI(ctx, l.URI)
			if err == nil {
				defer nc.Close()
				b := make([]byte, len(pattern))
				if _, err := nc.ReadAtContext(ctx, b, 0); err != nil {
					t.Fatalf("read the lease: %v", err)
				}
				return bytes.Equal(b, pattern)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the lease is not served: %v", err)
			case <-tick.C:
			}
		}
	}

	pid := fmt.Sprintf("pid %d", first.cmd.Process.Pid)
	for _, tc := range []struct {
		what, stateDir string
		want           []string
	}{
		{"another state directory, the same device file", filepath.Join(dir, "elsewhere"),
			[]string{"block device disk0 (" + disk + ") is in use by another rialto agent", pid}},
		{"the same state directory", state,
			[]string{"state directory " + state + " is in use by another rialto agent", pid}},
	} {
		// Not refused, the second agent would run: its context ends it.
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		cmd := exec.CommandContext(rctx, bin, agentArgs(tc.stateDir)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		timedOut := rctx.Err() != nil
		rcancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || timedOut {
			t.Fatalf("a second agent on %s: %v, want exit status 1 at once\n%s", tc.what, err, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("a second agent on %s says\n%s\nnot %q", tc.what, out, w)
			}
		}
		if !intact() {
			t.Fatalf("after a second agent on %s, the tenant's bytes changed", tc.what)
		}
	}

	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.done
	since := time.Now()
	startProc(t, bin, env, "", agentArgs(state)...)
	readySince(since)
	if !intact() {
		t.Fatal("after the restart, the tenant's bytes changed or are not served")
	}
}
