package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestAgentVersionSkew runs a `rialto server` built with
// -ldflags "-X main.version=v1.5.2" and `rialto agent` (in process, its
// version set through the same variable) of several versions: agents of
// v1.5 and v1.4 join; older and newer ones are refused, the agent exiting
// with an error that names both versions.
func TestAgentVersionSkew(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build the binary")
	}
	bin := filepath.Join(t.TempDir(), "rialto-v1.5.2")
	if out, err := exec.Command(gobin, "build", "-ldflags", "-X main.version=v1.5.2", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	srv := startServerDaemon(t, bin, []string{"RIALTO_BOOTSTRAP_TOKEN=boot-secret", "RIALTO_ADMIN_TOKEN=admin-secret"},
		"--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--tls-dir", filepath.Join(dir, "tls"), "--heartbeat", "200ms")
	caFile := filepath.Join(dir, "tls", "ca-cert.pem")
	hc, err := api.HTTPClient(caFile, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(srv.url, "admin-secret", hc)

	saved := version
	t.Cleanup(func() { version = saved })
	for _, c := range []struct {
		version string
		refusal string // "": joins
	}{
		{"v1.5.0", ""},
		{"v1.4.3", ""},
		{"v1.3.9", "agent version v1.3.9 is too old for the control plane's v1.5.2, which accepts agents of v1.5 and v1.4: upgrade the agent"},
		{"v1.6.0", "agent version v1.6.0 is newer than the control plane's v1.5.2: upgrade the control plane first"},
		{"v2.0.0", "agent version v2.0.0 is another major version than the control plane's v1.5.2"},
	} {
		t.Run(c.version, func(t *testing.T) {
			version = c.version
			name := "n" + strings.ReplaceAll(c.version, ".", "-")
			var out, errb logtest.Buffer
			e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string {
				return map[string]string{"RIALTO_BOOTSTRAP_TOKEN": "boot-secret", "RIALTO_ADDR": srv.url, "RIALTO_CACERT": caFile}[k]
			}}
			ctx, cancel := context.WithCancel(context.Background())
			code := make(chan int, 1)
			go func() {
				code <- run(ctx, []string{"agent", "--name", name, "--state-dir", filepath.Join(dir, name), "--memory", "16MiB", "--log-level", "warn"}, e)
			}()
			defer func() {
				cancel()
				<-code
			}()
			if c.refusal != "" {
				select {
				case got := <-code:
					code <- got
					if got != 1 || !strings.Contains(errb.String(), c.refusal) {
						t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and %q", got, errb.String(), c.refusal)
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("agent %s not refused; stderr:\n%s", c.version, errb.String())
				}
				return
			}
			poll(t, "node "+name+" ready", 30*time.Second, func() bool {
				ns, err := cl.Nodes(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, n := range ns {
					if n.Name == name && n.State == api.NodeReady {
						return true
					}
				}
				select {
				case got := <-code:
					code <- got
					t.Fatalf("agent %s exited %d:\n%s", c.version, got, errb.String())
				default:
				}
				return false
			})
			srv.waitLog(t, "agent_version="+c.version, 1)
		})
	}
}
