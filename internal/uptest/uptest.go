package uptest

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// ModuleRoot returns the directory of go.mod above the working directory.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("uptest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Main runs a test binary's tests (call it from TestMain) and removes
// the rialto binary Binary built.
func Main(m *testing.M) {
	code := m.Run()
	if built != "" {
		os.RemoveAll(filepath.Dir(built))
	}
	os.Exit(code)
}

// Binary builds ./cmd/rialto once per test process; Main removes it.
func Binary(t testing.TB) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build the rialto binary")
	}
	root := ModuleRoot(t)
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rialto-uptest-")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "rialto")
		cmd := exec.Command(gobin, "build", "-o", built, "./cmd/rialto")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// Up is a running `rialto up`. Its API is HTTPS; CACert is the cluster CA's
// certificate to verify it against. LoginURL is the one-time dashboard
// sign-in link it printed.
type Up struct {
	Addr, Token, Dir, CACert, LoginURL string
	cmd                                *exec.Cmd
	mu                                 sync.Mutex
	out                                strings.Builder
	done                               chan error
}

// StartUp starts `rialto up --state-dir dir` with small disks and extra
// flags, and waits until it prints its address and token. The cluster is
// stopped when the test ends.
func StartUp(t testing.TB, bin, dir string, extra ...string) *Up {
	t.Helper()
	args := append([]string{"up", "--state-dir", dir, "--disk-size", "256MiB", "--memory", "64MiB", "--accel", "1", "--heartbeat", "250ms"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	u := &Up{cmd: cmd, Dir: dir, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		closed := false
		for sc.Scan() {
			line := sc.Text()
			u.mu.Lock()
			u.out.WriteString(line + "\n")
			if v, ok := strings.CutPrefix(line, "Dashboard:"); ok {
				u.LoginURL = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "export RIALTO_ADDR="); ok {
				u.Addr = v
			}
			if v, ok := strings.CutPrefix(line, "export RIALTO_CACERT="); ok {
				u.CACert = v
			}
			if v, ok := strings.CutPrefix(line, "export RIALTO_TOKEN="); ok {
				u.Token = v
				if !closed {
					close(ready)
					closed = true
				}
			}
			u.mu.Unlock()
		}
		io.Copy(io.Discard, stdout)
		u.done <- cmd.Wait()
	}()
	t.Cleanup(func() { u.Stop(t) })
	select {
	case <-ready:
	case err := <-u.done:
		u.done <- err
		t.Fatalf("rialto up exited early: %v\n%s", err, u.Output())
	case <-time.After(60 * time.Second):
		t.Fatalf("rialto up not ready:\n%s", u.Output())
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u
}

// Output is what rialto up printed so far.
func (u *Up) Output() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.out.String()
}

// Env is the environment for CLI verbs against this cluster.
func (u *Up) Env() []string {
	return append(os.Environ(), "RIALTO_ADDR="+u.Addr, "RIALTO_CACERT="+u.CACert, "RIALTO_TOKEN="+u.Token)
}

// HTTPClient is an HTTP client that verifies the cluster's API against its
// CA.
func (u *Up) HTTPClient(t testing.TB) *http.Client {
	t.Helper()
	hc, err := api.HTTPClient(u.CACert, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return hc
}

// ClusterHTTPClient is an HTTP client that trusts the cluster CA and any
// certificate it issued, a node's included: for an agent's endpoints (its
// /metrics), which HTTPClient refuses (it accepts only a control plane's).
func (u *Up) ClusterHTTPClient(t testing.TB) *http.Client {
	t.Helper()
	cfg, err := api.TLSConfig(u.CACert)
	if err != nil {
		t.Fatal(err)
	}
	cfg.VerifyConnection = nil
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Timeout: time.Minute, Transport: tr}
}

// ServerSPKIHash is the base64 SHA-256 of the API certificate's public key
// (what chromium's --ignore-certificate-errors-spki-list takes), read from
// a TLS connection verified against the cluster CA.
func (u *Up) ServerSPKIHash(t testing.TB) string {
	t.Helper()
	cfg, err := api.TLSConfig(u.CACert)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", strings.TrimPrefix(u.Addr, "https://"), cfg)
	if err != nil {
		t.Fatalf("uptest: %v", err)
	}
	defer c.Close()
	sum := sha256.Sum256(c.ConnectionState().PeerCertificates[0].RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// DataTLS is a borrower's TLS configuration for the cluster's data planes
// (nbds://, rialto-mems://, rialto-accels://, rialto-nics://): it trusts
// the cluster CA.
func (u *Up) DataTLS(t testing.TB) *tls.Config {
	t.Helper()
	cfg, err := pki.LoadClientTLS(u.CACert)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// LibnbdURI is an nbds:// lease URI as libnbd's tools (nbdinfo, nbdcopy)
// take it: with ?tls-certificates= the directory of the cluster CA's
// ca-cert.pem.
func (u *Up) LibnbdURI(uri string) string {
	if !strings.HasPrefix(uri, "nbds://") {
		return uri
	}
	return uri + "?tls-certificates=" + filepath.Dir(u.CACert)
}

// Client is an API client with the cluster's admin token.
func (u *Up) Client(t testing.TB) *api.Client {
	t.Helper()
	return api.NewClient(u.Addr, u.Token, u.HTTPClient(t))
}

// Pid is the process ID of `rialto up`.
func (u *Up) Pid() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cmd.Process.Pid
}

// Kill SIGKILLs `rialto up` (its children are left to what it set up for
// a parent's crash) and waits for it; Stop after it does nothing.
func (u *Up) Kill() {
	cmd := u.take()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-u.done
}

// Stop stops the cluster (SIGTERM, then kill after 20s) and fails the
// test unless it exits cleanly; it may be called more than once.
func (u *Up) Stop(t testing.TB) {
	t.Helper()
	cmd := u.take()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-u.done:
		if err != nil {
			t.Errorf("rialto up after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-u.done
		t.Errorf("rialto up did not stop on SIGTERM")
	}
}

// take returns the running process, once: nil after Kill or Stop.
func (u *Up) take() *exec.Cmd {
	u.mu.Lock()
	defer u.mu.Unlock()
	cmd := u.cmd
	u.cmd = nil
	return cmd
}
