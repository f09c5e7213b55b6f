package main

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/logtest"
)

// daemon is a rialto server started for a test, its stderr (the log)
// kept for the test to read.
type daemon struct {
	cmd  *exec.Cmd
	log  logtest.Buffer
	url  string
	done chan error
}

func startServerDaemon(t *testing.T, bin string, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(bin, append([]string{"server"}, args...)...), done: make(chan error, 1)}
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stderr = &d.log
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "rialto server: serving "); ok {
				urls <- u
			}
		}
		d.done <- d.cmd.Wait()
	}()
	t.Cleanup(func() {
		d.cmd.Process.Signal(syscall.SIGTERM)
		<-d.done
	})
	select {
	case d.url = <-urls:
	case err := <-d.done:
		t.Fatalf("rialto server exited early: %v\n%s", err, d.log.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("rialto server: no serving line\n%s", d.log.String())
	}
	return d
}

// waitLog waits until the log holds n lines containing s.
func (d *daemon) waitLog(t *testing.T, s string, n int) {
	t.Helper()
	poll(t, "log line "+s, 30*time.Second, func() bool {
		// Lines, not occurrences: a refusal's error may quote its message.
		got := 0
		for _, line := range strings.Split(d.log.String(), "\n") {
			if strings.Contains(line, s) {
				got++
			}
		}
		return got >= n
	})
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	// Written aside and renamed, as an editor or a configuration tool
	// would, so the server never reads half a file.
	if err := os.WriteFile(path+".new", []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// TestConfigFileAndSIGHUP runs `rialto server` and `rialto agent` from
// configuration files, the command line overriding them, and reloads the
// server's quotas and token file with a real SIGHUP: a new token works, a
// removed one stops, a raised quota admits more leases, the leases held
// stay as they were; a malformed file or a bad value is refused with a log
// line and changes nothing. No log line shows a token.
func TestConfigFileAndSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	const (
		boot  = "boot-secret-4f1c"
		alice = "alice-secret-9d2e"
		bob   = "bob-secret-77a0"
	)
	srvConf, tokens := filepath.Join(dir, "server.toml"), filepath.Join(dir, "tokens")
	base := `# rialto server
listen = "127.0.0.1:9"  # overridden on the command line
db = "` + filepath.Join(dir, "cp.db") + `"
tls-dir = "` + filepath.Join(dir, "tls") + `"
heartbeat = "200ms"
log-level = "info"
token-file = "` + tokens + `"
`
	writeFile(t, tokens, alice+":alice\n")
	writeFile(t, srvConf, base+`quota = ["leases=1"]
`)
	srv := startServerDaemon(t, bin, []string{"RIALTO_BOOTSTRAP_TOKEN=" + boot, "RIALTO_CONFIG=" + srvConf}, "--listen", "127.0.0.1:0")
	caFile := filepath.Join(dir, "tls", "ca-cert.pem")

	agentConf := filepath.Join(dir, "agent.toml")
	writeFile(t, agentConf, `name = "rack1-n1"
state-dir = "`+filepath.Join(dir, "agent")+`"
block = ["disk0=disk0.img:64MiB"]
log-level = "warn"
control-plane = "`+srv.url+`"
cacert = "`+caFile+`"
`)
	startProc(t, bin, []string{"RIALTO_BOOTSTRAP_TOKEN=" + boot}, "", "agent", "--config", agentConf)

	hc, err := api.HTTPClient(caFile, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, cb := api.NewClient(srv.url, alice, hc), api.NewClient(srv.url, bob, hc)
	poll(t, "the agent's node ready", 30*time.Second, func() bool {
		ns, err := ca.Nodes(ctx)
		return err == nil && len(ns) == 1 && ns[0].Name == "rack1-n1" && ns[0].State == api.NodeReady
	})
	small := api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}
	held, err := ca.CreateLease(ctx, small)
	if err != nil {
		t.Fatal(err)
	}
	status := func(err error) int {
		var ae *api.Error
		if errors.As(err, &ae) {
			return ae.Status
		}
		return 0
	}
	if _, err := ca.CreateLease(ctx, small); status(err) != http.StatusTooManyRequests {
		t.Fatalf("a second lease over the quota: %v", err)
	}
	if _, err := cb.Leases(ctx); status(err) != http.StatusUnauthorized {
		t.Fatalf("bob before the reload: %v", err)
	}

	hup := func() {
		t.Helper()
		if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	// Bob added, the quota raised.
	writeFile(t, tokens, alice+":alice\n"+bob+":bob\n")
	writeFile(t, srvConf, base+`quota = ["leases=3"]
`)
	hup()
	srv.waitLog(t, "settings reloaded", 1)
	if _, err := cb.Leases(ctx); err != nil {
		t.Fatalf("bob after the reload: %v", err)
	}
	if _, err := ca.CreateLease(ctx, small); err != nil {
		t.Fatalf("alice's second lease under the raised quota: %v", err)
	}
	got, err := ca.Lease(ctx, held.ID)
	if err != nil || got.State != api.LeaseActive || got.URI != held.URI {
		t.Fatalf("the lease held across the reload: %v %+v", err, got)
	}

	// Malformed files and bad values are refused; bob keeps working.
	good := base + "quota = [\"leases=3\"]\n"
	for i, bad := range []struct{ conf, tokens string }{
		{base + "quota = [\"leases=1\"\n", ""},                               // TOML syntax
		{base + "quota = [\"alice:gpus=1\"]\n", ""},                          // a limit quotas do not have
		{good, alice + ":alice\n" + bob + "\n"},                              // a token without a tenant
		{base + "quotas = [\"leases=1\"]\n", ""},                             // a key no flag has
		{good, alice + ":alice:root\n"},                                      // not :admin
		{base + "token = [\"" + bob + ":bob\"]\n", ""},                       // a secret in the configuration
		{good, bob + ":bob\n" + bob + ":mallory\n"},                          // one secret, two tenants
		{strings.Replace(good, tokens, filepath.Join(dir, "absent"), 1), ""}, // a token file that is not there
	} {
		if bad.tokens != "" {
			writeFile(t, tokens, bad.tokens)
		}
		writeFile(t, srvConf, bad.conf)
		hup()
		srv.waitLog(t, "reload refused", i+1)
		if _, err := cb.Leases(ctx); err != nil {
			t.Fatalf("bob after refused reload %d: %v", i, err)
		}
		writeFile(t, tokens, alice+":alice\n"+bob+":bob\n")
	}
	for _, want := range []string{"server.toml:8: toml: array is incomplete", `server.toml:8: quota: quota \"alice:gpus=1\": unknown limit`,
		"tenant tokens: --token-file " + tokens + ": line 2: bad token spec", `server.toml:8: unknown key \"quotas\"`,
		"server.toml:8: token: a secret is not written in the configuration file", "is also tenant bob", "--token-file: open "} {
		if !strings.Contains(srv.log.String(), want) {
			t.Errorf("no refusal %q in the log:\n%s", want, srv.log.String())
		}
	}

	// Bob removed: his token stops at once.
	writeFile(t, tokens, alice+":alice\n")
	writeFile(t, srvConf, good)
	hup()
	srv.waitLog(t, "settings reloaded", 2)
	if _, err := cb.Leases(ctx); status(err) != http.StatusUnauthorized {
		t.Fatalf("bob after his removal: %v", err)
	}
	if _, err := ca.Leases(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{boot, alice, bob} {
		if strings.Contains(srv.log.String(), s) {
			t.Fatalf("the server's log shows a token:\n%s", srv.log.String())
		}
	}
}

// TestDaemonRefusalsExitTwo: a daemon (server, agent, up, appliance)
// that refuses its settings — a flag's value, flags that do not go
// together, a required setting missing, a mistake in its configuration
// file — exits 2 with the usage line that names its help, as every verb
// does for a mistake on its command line; a file it cannot read is a
// failure (1). `rialto server --db postgres://u:PASSWORD@…` and a bad
// --quota, token spec or configuration key exited 1.
func TestDaemonRefusalsExitTwo(t *testing.T) {
	dir := t.TempDir()
	conf := func(name, text string) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, text)
		return p
	}
	tok := secretFileOf(t, "x")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"server", "--db", "postgres://rialto:pw@127.0.0.1:1/rialto"}, 2, "--db puts the database password on the command line"},
		{[]string{"server", "--quota", "leases=lots"}, 2, "leases"},
		{[]string{"server", "--token-file", secretFileOf(t, "just-a-token")}, 2, "bad token spec"},
		{[]string{"server", "--config", conf("unknown.toml", "quotas = [\"leases=1\"]\n")}, 2, `unknown.toml:1: unknown key "quotas"`},
		{[]string{"server", "--config", conf("badval.toml", "default-ttl = \"soon\"\n")}, 2, "badval.toml:1: default-ttl"},
		{[]string{"server", "--config", conf("secret.toml", "admin-token = \"x\"\n")}, 2, "a secret is not written in the configuration file"},
		{[]string{"server", "--config", filepath.Join(dir, "absent.toml")}, 1, "absent.toml"},
		{[]string{"server", "--admin-token-file", filepath.Join(dir, "absent")}, 1, "--admin-token-file: open "},
		{[]string{"agent"}, 2, "a bootstrap token is required"},
		{[]string{"agent", "--bootstrap-token-file", tok}, 2, "--cacert or RIALTO_CACERT"},
		{[]string{"agent", "--bootstrap-token-file", tok, "--insecure-dataplane", "--memory", "lots"}, 2, "--memory"},
		{[]string{"agent", "--bootstrap-token-file", tok, "--insecure-dataplane", "--block", "d0="}, 2, "bad --block"},
		{[]string{"agent", "--bootstrap-token-file", tok, "--insecure-dataplane", "--log-level", "loud"}, 2, "bad --log-level"},
		{[]string{"agent", "--config", conf("agent.toml", "blocks = [\"x\"]\n")}, 2, `agent.toml:1: unknown key "blocks"`},
		{[]string{"up", "--quota", "nonsense"}, 2, "nonsense"},
		{[]string{"up", "--replicas", "0"}, 2, "--replicas must be 1 to 16"},
		{[]string{"appliance", "--bootstrap-token-file", tok, "--insecure-dataplane", "--slots", "0"}, 2, "--slots must be at least 1"},
		{[]string{"appliance", "--bootstrap-token", "x"}, 2, "--bootstrap-token puts a secret on the command line"},
	} {
		_, errs, code := runCLI(t, "http://127.0.0.1:1", tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
		if tc.code == 2 && !strings.Contains(errs, "; see 'rialto "+tc.args[0]+" -h'") {
			t.Errorf("%v: the refusal does not name the help: %q", tc.args, errs)
		}
	}
}

// TestTokenFileRefusalNamesTheLine: a token file with a line that does
// not parse is refused naming the file and the line's number (counted
// as an editor counts, blank lines included), never the line's text (a
// secret): at start and on reload. The refusal named neither, which left
// an operator to search a long token file by hand; and a comment line,
// which a token file cannot have, was as hard to find. RIALTO_TOKENS's
// comma-separated entries are named by number.
func TestTokenFileRefusalNamesTheLine(t *testing.T) {
	secretText := "s3cret-not-a-spec"
	f := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(f, []byte("\n\nt0k-alice:alice\n\n"+secretText+"\nt0k-bob:bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code := runCLI(t, "http://127.0.0.1:1", "server", "--token-file", f)
	if want := "--token-file " + f + ": line 5: bad token spec"; code != 2 || !strings.Contains(errs, want) || strings.Contains(errs, secretText) {
		t.Errorf("start: exit %d, stderr %q; want 2 and %q, without the line", code, errs, want)
	}
	if _, err := parseTokens(tokenSource{name: "RIALTO_TOKENS"}, "t0k-alice:alice, "+secretText); err == nil ||
		!strings.Contains(err.Error(), "RIALTO_TOKENS: entry 2: bad token spec") || strings.Contains(err.Error(), secretText) {
		t.Errorf("RIALTO_TOKENS: %v; want entry 2 named, without it", err)
	}
}
