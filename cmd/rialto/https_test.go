package main

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/pki"
)

// TestServerHTTPS: `rialto server --tls-dir` creates the cluster CA and
// serves the API over HTTPS; curl and the CLI verify it against the CA
// certificate and refuse a server they cannot verify.
func TestServerHTTPS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	secrets := []string{"RIALTO_BOOTSTRAP_TOKEN=boot-secret", "RIALTO_ADMIN_TOKEN=admin-secret"}
	_, url := startProc(t, bin, secrets, "rialto server: serving ",
		"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--tls-dir", tlsDir, "--log-level", "warn")
	if !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Fatalf("server URL %q", url)
	}
	caFile := filepath.Join(tlsDir, pki.CACertFile)
	for name, perm := range map[string]os.FileMode{tlsDir: 0o700, filepath.Join(tlsDir, pki.CAKeyFile): 0o600} {
		if st, err := os.Stat(name); err != nil || st.Mode().Perm() != perm {
			t.Fatalf("%s: %v, want mode %v", name, err, perm)
		}
	}
	other, err := pki.Open(filepath.Join(dir, "other"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}

	// curl, with the CA and without.
	if _, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command("curl", "-sS", "--fail", "--cacert", caFile, url+"/healthz").CombinedOutput()
		if err != nil {
			t.Fatalf("curl --cacert: %v\n%s", err, out)
		}
		out, err = exec.Command("curl", "-sS", "--fail", "--cacert", caFile, "-H", "Authorization: Bearer admin-secret", url+"/v1/nodes").CombinedOutput()
		if err != nil || !json.Valid(out) {
			t.Fatalf("curl --cacert /v1/nodes: %v\n%s", err, out)
		}
		for _, args := range [][]string{{url + "/healthz"}, {"--cacert", other.CertFile(), url + "/healthz"}} {
			out, err := exec.Command("curl", append([]string{"-sS", "--fail"}, args...)...).CombinedOutput()
			var ee *exec.ExitError
			// 60: the peer's certificate cannot be authenticated.
			if !errors.As(err, &ee) || ee.ExitCode() != 60 {
				t.Fatalf("curl %v: %v (want exit 60)\n%s", args, err, out)
			}
		}
		// Plain HTTP to the HTTPS port gets nothing of the API.
		out, _ = exec.Command("curl", "-sS", "-H", "Authorization: Bearer admin-secret", "http"+strings.TrimPrefix(url, "https")+"/v1/nodes").CombinedOutput()
		if !strings.Contains(string(out), "HTTP request to an HTTPS server") {
			t.Fatalf("plain HTTP to the API: %s", out)
		}
	}

	// The CLI.
	cli := func(env ...string) (string, error) {
		cmd := exec.Command(bin, "nodes", "-o", "json")
		cmd.Env = append(os.Environ(), append([]string{"RIALTO_ADDR=" + url, "RIALTO_TOKEN=admin-secret", "RIALTO_CACERT="}, env...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := cli("RIALTO_CACERT=" + caFile); err != nil || !json.Valid([]byte(out)) {
		t.Fatalf("rialto nodes with RIALTO_CACERT: %v\n%s", err, out)
	}
	bare := strings.TrimPrefix(url, "https://")
	if out, err := cli("RIALTO_ADDR="+bare, "RIALTO_CACERT="+caFile); err != nil {
		t.Fatalf("rialto nodes with an address without scheme (HTTPS assumed): %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"no CA", nil, "RIALTO_CACERT"},
		{"another cluster's CA", []string{"RIALTO_CACERT=" + other.CertFile()}, "not trusted"},
		{"a missing CA file", []string{"RIALTO_CACERT=" + filepath.Join(dir, "nope.pem")}, "nope.pem"},
	} {
		out, err := cli(tc.env...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Fatalf("rialto nodes, %s: %v\n%s", tc.name, err, out)
		}
		t.Logf("%s: %s", tc.name, strings.TrimSpace(out))
	}

	// A restart keeps the CA: the same certificate file still verifies.
	ca, err := pki.Load(tlsDir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	serial := ca.Certificate().SerialNumber
	_, url2 := startProc(t, bin, secrets, "rialto server: serving ",
		"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp2.db"), "--tls-dir", tlsDir, "--log-level", "warn")
	if out, err := cli("RIALTO_ADDR="+url2, "RIALTO_CACERT="+caFile); err != nil {
		t.Fatalf("second server on the same CA: %v\n%s", err, out)
	}
	if again, _ := pki.Load(tlsDir, pki.Options{}); again.Certificate().SerialNumber.Cmp(serial) != 0 {
		t.Fatal("a restart made a new CA")
	}

	// Rotation: a server started after `rialto ca rotate` has a certificate
	// from the new CA; the new ca-cert.pem (both CAs) verifies it, a copy
	// of the old one does not.
	oldCA := filepath.Join(dir, "old-ca-cert.pem")
	b, _ := os.ReadFile(caFile)
	os.WriteFile(oldCA, b, 0o644)
	if out, err := exec.Command(bin, "ca", "rotate", "--tls-dir", tlsDir).CombinedOutput(); err != nil {
		t.Fatalf("rialto ca rotate: %v\n%s", err, out)
	}
	_, url3 := startProc(t, bin, secrets, "rialto server: serving ",
		"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp3.db"), "--tls-dir", tlsDir, "--log-level", "warn")
	if out, err := cli("RIALTO_ADDR="+url3, "RIALTO_CACERT="+caFile); err != nil {
		t.Fatalf("after rotation, with the new ca-cert.pem: %v\n%s", err, out)
	}
	if out, err := cli("RIALTO_ADDR="+url2, "RIALTO_CACERT="+caFile); err != nil {
		t.Fatalf("a server still on the old CA, with the new ca-cert.pem: %v\n%s", err, out)
	}
	if out, err := cli("RIALTO_ADDR="+url3, "RIALTO_CACERT="+oldCA); err == nil || !strings.Contains(out, "not trusted") {
		t.Fatalf("after rotation, with the old ca-cert.pem: %v\n%s", err, out)
	}
}

// TestServerInsecureHTTP: plain HTTP only behind the explicit flag, which
// refuses to go with TLS settings.
func TestServerInsecureHTTP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	secrets := []string{"RIALTO_ADMIN_TOKEN=admin-secret"}
	_, url := startProc(t, bin, secrets, "rialto server: serving ",
		"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--insecure-http", "--log-level", "warn")
	if !strings.HasPrefix(url, "http://") {
		t.Fatalf("--insecure-http URL %q", url)
	}
	if _, err := os.Stat(filepath.Join(dir, "rialto-tls")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("--insecure-http made a CA: %v", err)
	}
	cmd := exec.Command(bin, "nodes")
	cmd.Env = append(os.Environ(), "RIALTO_ADDR="+url, "RIALTO_TOKEN=admin-secret")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("rialto nodes over HTTP: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "server", "--insecure-http", "--tls-dir", dir, "--db", filepath.Join(dir, "x.db")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "does not go with") {
		t.Fatalf("--insecure-http with --tls-dir: %v\n%s", err, out)
	}
}

func TestAPIHosts(t *testing.T) {
	tcp := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	for _, tc := range []struct {
		listen string
		addr   net.Addr
		extra  []string
		want   []string // all present
		not    []string
	}{
		{"127.0.0.1:7070", tcp("127.0.0.1:7070"), nil, []string{"127.0.0.1", "localhost"}, nil},
		{"10.0.0.5:7070", tcp("10.0.0.5:7070"), []string{"cp.rack"}, []string{"10.0.0.5", "cp.rack"}, []string{"localhost"}},
		{"cp.example:7070", tcp("10.0.0.5:7070"), nil, []string{"cp.example", "10.0.0.5"}, nil},
		{"0.0.0.0:7070", tcp("0.0.0.0:7070"), nil, []string{"127.0.0.1", "localhost"}, []string{"0.0.0.0"}},
	} {
		got := apiHosts(tc.listen, tc.addr, tc.extra)
		has := map[string]bool{}
		for _, h := range got {
			if has[h] {
				t.Errorf("%s: %q twice in %v", tc.listen, h, got)
			}
			has[h] = true
		}
		for _, w := range tc.want {
			if !has[w] {
				t.Errorf("%s: %v lacks %q", tc.listen, got, w)
			}
		}
		for _, w := range tc.not {
			if has[w] {
				t.Errorf("%s: %v has %q", tc.listen, got, w)
			}
		}
	}
}
