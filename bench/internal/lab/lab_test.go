package lab

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildRialto builds the product binary of the enclosing module.
func buildRialto(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rialto")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/rialto")
	cmd.Dir = "../../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestLeasesOfAgentProcesses runs a server and agents as processes, makes
// a dedicated and a composed lease with the CLI, and moves bytes through
// them with nbdcopy: through the dedicated lease's URI and through
// `rialto attach` of the composed one.
func TestLeasesOfAgentProcesses(t *testing.T) {
	for _, tool := range []string{"nbdcopy", "nbdinfo"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := buildRialto(t)
	dir := t.TempDir()
	c, err := Start(ctx, Config{Bin: bin, Dir: filepath.Join(dir, "lab")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	ded, err := c.StartAgent(ctx, Agent{Name: "ded", Blocks: []string{"disk0=" + filepath.Join(dir, "ded.img") + ":6MiB"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := c.StartAgent(ctx, Agent{Name: "c" + string(rune('0'+i)), Labels: []string{"pool=c"},
			Blocks: []string{"disk0=" + filepath.Join(dir, "c"+string(rune('0'+i))+".img") + ":2MiB"}}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.CreateLease(ctx, "--kind", "block", "--mode", "dedicated", "--size", "6MiB", "--affinity", "ded")
	if err != nil {
		t.Fatal(err)
	}
	comp, err := c.CreateLease(ctx, "--kind", "block", "--mode", "composed", "--count", "3", "--size", "6MiB", "--label", "pool=c")
	if err != nil {
		t.Fatal(err)
	}
	if len(comp.Parts) != 3 {
		t.Fatalf("composed lease has %d parts", len(comp.Parts))
	}
	at, err := c.Attach(ctx, comp.ID)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "src")
	data := bytes.Repeat([]byte("rialto bench lab "), 6<<20/17+1)[:6<<20]
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, uri := range []string{l.URI, at.URI} {
		if out, err := exec.CommandContext(ctx, "nbdcopy", src, uri).CombinedOutput(); err != nil {
			t.Fatalf("nbdcopy write: %v: %s", err, out)
		}
		dst := filepath.Join(dir, "dst")
		if out, err := exec.CommandContext(ctx, "nbdcopy", uri, dst).CombinedOutput(); err != nil {
			t.Fatalf("nbdcopy read: %v: %s", err, out)
		}
		got, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("read back differs from what was written")
		}
	}
	if ok, err := ded.Exited(); ok {
		t.Fatalf("agent exited: %v", err)
	}
	// The agent's /metrics, found through the control plane's scrape
	// targets and fetched with the cluster CA.
	murl, hc, err := c.AgentMetrics(ctx, "ded")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(murl)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "rialto_") {
		t.Fatalf("GET %s: %s\n%.300s", murl, resp.Status, body)
	}
	if _, _, err := c.AgentMetrics(ctx, "no-such-node"); err == nil {
		t.Error("AgentMetrics of a node that does not exist: no error")
	}
	// Secrets stay out of the recorded commands.
	for _, cmd := range c.Commands {
		if strings.Contains(cmd, c.admin) || strings.Contains(cmd, c.boot) || strings.Contains(cmd, l.Credential) {
			t.Errorf("command %q holds a secret", cmd)
		}
	}
	if err := at.Stop(); err != nil {
		t.Errorf("attach: %v", err)
	}
}

// TestInsecureDataplaneArgs: the agents get --insecure-dataplane only
// from a binary whose `agent --help` lists it (before data-plane TLS the
// flag does not exist and the agent would refuse it).
func TestInsecureDataplaneArgs(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, help string
		want       []string
	}{
		{"tls-by-default", "Flags:\n  -insecure-dataplane\n    \tserve the data planes without TLS\n", []string{"--insecure-dataplane"}},
		{"plaintext-only", "Flags:\n  -listen string\n    \taddress to serve on\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := filepath.Join(dir, tc.name)
			script := "#!/bin/sh\n[ \"$1 $2\" = \"agent --help\" ] || exit 3\nprintf '%s' '" + tc.help + "' >&2\nexit 2\n"
			if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			got := InsecureDataplaneArgs(bin)
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("InsecureDataplaneArgs = %q, want %q", got, tc.want)
			}
		})
	}
}
