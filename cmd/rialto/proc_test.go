package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// proc is a background rialto process whose stdout is scanned for a line.
type proc struct {
	cmd  *exec.Cmd
	done chan error
}

func startProc(t *testing.T, bin string, env []string, wantPrefix string, args ...string) (*proc, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	lines := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		var acc string
		for {
			n, err := stdout.Read(buf)
			acc += string(buf[:n])
			for {
				i := strings.IndexByte(acc, '\n')
				if i < 0 {
					break
				}
				select {
				case lines <- acc[:i]:
				default:
				}
				acc = acc[i+1:]
			}
			if err != nil {
				break
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.done
		}
	})
	if wantPrefix == "" {
		return p, ""
	}
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l := <-lines:
			if v, ok := strings.CutPrefix(l, wantPrefix); ok {
				return p, v
			}
		case err := <-p.done:
			t.Fatalf("rialto %v exited early: %v", args, err)
		case <-deadline:
			t.Fatalf("rialto %v: no %q line", args, wantPrefix)
		}
	}
}

// TestServerAndAgentProcesses runs `rialto server` and two `rialto agent`
// processes, SIGKILLs the lender of a lease and watches its node go down
// and the lease get lost within the grace period; the restarted agent is
// the same node and drops the stale export.
func TestServerAndAgentProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	secrets := []string{"RIALTO_BOOTSTRAP_TOKEN=boot-secret", "RIALTO_ADMIN_TOKEN=admin-secret"}
	_, url := startProc(t, bin, secrets, "rialto server: serving ",
		"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--tls-dir", filepath.Join(dir, "tls"),
		"--heartbeat", "200ms", "--suspect-after", "2s", "--down-after", "4s", "--log-level", "warn")
	caFile := filepath.Join(dir, "tls", "ca-cert.pem")
	startAgent := func(name string) *proc {
		p, _ := startProc(t, bin, append(secrets, "RIALTO_ADDR="+url, "RIALTO_CACERT="+caFile), "",
			"agent", "--name", name, "--state-dir", filepath.Join(dir, name),
			"--block", "disk0=disk0.img:64MiB", "--log-level", "warn")
		return p
	}
	agents := map[string]*proc{"a1": startAgent("a1"), "a2": startAgent("a2")}

	hc, err := api.HTTPClient(caFile, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(url, "admin-secret", hc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			<-tick.C
		}
	}
	nodeStates := func() map[string]api.Node {
		ns, err := cl.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]api.Node{}
		for _, n := range ns {
			m[n.Name] = n
		}
		return m
	}
	waitFor("two ready nodes", 30*time.Second, func() bool {
		m := nodeStates()
		return len(m) == 2 && m["a1"].State == api.NodeReady && m["a2"].State == api.NodeReady
	})

	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var victim string
	for name, n := range nodeStates() {
		if n.ID == l.NodeID {
			victim = name
		}
	}
	agents[victim].cmd.Process.Signal(syscall.SIGKILL)
	<-agents[victim].done
	killed := time.Now()
	waitFor("node down", 30*time.Second, func() bool { return nodeStates()[victim].State == api.NodeDown })
	t.Logf("node down %v after SIGKILL (grace period 4s, sweep every 200ms)", time.Since(killed).Round(10*time.Millisecond))
	// The sweep that marks the node down then marks its leases lost.
	waitFor("lease lost", 10*time.Second, func() bool {
		got, err := cl.Lease(ctx, l.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.State == api.LeaseLost
	})

	// Restarted on its state dir, it is the same node, ready again, and
	// does not serve the lost lease.
	startAgent(victim)
	waitFor("node ready again", 30*time.Second, func() bool { return nodeStates()[victim].State == api.NodeReady })
	if id := nodeStates()[victim].ID; id != l.NodeID {
		t.Fatalf("restarted agent is node %s, was %s", id, l.NodeID)
	}
	waitFor("stale export torn down", 30*time.Second, func() bool {
		c, err := nbd.DialURI(ctx, l.URI)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
}
