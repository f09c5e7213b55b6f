package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestAgentTLSPSK runs `rialto server` and `rialto agent --tls-psk FILE`,
// creates a block lease through the API and uses it with libnbd's
// tls-psk-file (nbdinfo, nbdcopy both ways); the same lease is still
// served with certificates, and a key the agent does not hold is refused.
func TestAgentTLSPSK(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	for _, tool := range []string{"nbdinfo", "nbdcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	const key = "alice:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"
	keys := filepath.Join(dir, "keys.psk")
	if err := os.WriteFile(keys, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := []string{"RIALTO_BOOTSTRAP_TOKEN=boot-secret", "RIALTO_ADMIN_TOKEN=admin-secret"}
	_, url := startProc(t, bin, secrets, "rialto server: serving ",
		"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--tls-dir", filepath.Join(dir, "tls"),
		"--heartbeat", "200ms", "--log-level", "warn")
	caFile := filepath.Join(dir, "tls", "ca-cert.pem")
	agentProc, _ := startProc(t, bin, append(secrets, "RIALTO_ADDR="+url, "RIALTO_CACERT="+caFile), "",
		"agent", "--name", "a1", "--state-dir", filepath.Join(dir, "a1"),
		"--block", "disk0=disk0.img:64MiB", "--tls-psk", keys, "--log-level", "warn")

	hc, err := api.HTTPClient(caFile, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(url, "admin-secret", hc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ns, err := cl.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ns) == 1 && ns[0].State == api.NodeReady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the agent's node to be ready")
		}
		<-tick.C
	}
	const size = 8 << 20
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	rest, ok := strings.CutPrefix(l.URI, "nbds://")
	if !ok {
		t.Fatalf("lease URI %q is not nbds://", l.URI)
	}
	pskURI := func(user, file string) string { return "nbds://" + user + "@" + rest + "?tls-psk-file=" + file }
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	if got := strings.TrimSpace(run("nbdinfo", "--size", pskURI("alice", keys))); got != "8388608" {
		t.Fatalf("nbdinfo --size over TLS-PSK: %q", got)
	}
	src, dst := filepath.Join(dir, "src.img"), filepath.Join(dir, "dst.img")
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	run("nbdcopy", src, pskURI("alice", keys))
	run("nbdcopy", pskURI("alice", keys), dst)
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, data) {
		t.Fatal("nbdcopy round trip through the lease over TLS-PSK: the data differs")
	}
	// Certificates still work on the same port.
	certDir := filepath.Join(dir, "certs")
	os.MkdirAll(certDir, 0o700)
	ca, _ := os.ReadFile(caFile)
	os.WriteFile(filepath.Join(certDir, "ca-cert.pem"), ca, 0o644)
	if got := strings.TrimSpace(run("nbdinfo", "--size", l.URI+"?tls-certificates="+certDir)); got != "8388608" {
		t.Fatalf("nbdinfo --size over X.509: %q", got)
	}
	// Another key for the same identity is refused.
	wrong := filepath.Join(dir, "wrong.psk")
	os.WriteFile(wrong, []byte("alice:"+strings.Repeat("ab", 32)+"\n"), 0o600)
	if out, err := exec.CommandContext(ctx, "nbdinfo", "--size", pskURI("alice", wrong)).CombinedOutput(); err == nil || !strings.Contains(string(out), "gnutls_handshake") {
		t.Fatalf("nbdinfo with another key: %v\n%s", err, out)
	}
	// Rotation: the key file now holds that other key; after a SIGHUP the
	// agent takes it, and the old key is refused.
	old := filepath.Join(dir, "old.psk")
	os.WriteFile(old, []byte(key), 0o600)
	if err := os.WriteFile(keys, []byte("alice:"+strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := agentProc.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		out, err := exec.CommandContext(ctx, "nbdinfo", "--size", pskURI("alice", wrong)).CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) == "8388608" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rotated key is still refused 10 s after SIGHUP: %v\n%s", err, out)
		}
		<-tick.C
	}
	if out, err := exec.CommandContext(ctx, "nbdinfo", "--size", pskURI("alice", old)).CombinedOutput(); err == nil || !strings.Contains(string(out), "gnutls_handshake") {
		t.Fatalf("nbdinfo with the key rotated out: %v\n%s", err, out)
	}
}
