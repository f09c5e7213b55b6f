package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// loggedProc is a background rialto process whose output goes to a file.
type loggedProc struct {
	cmd  *exec.Cmd
	log  string
	done chan error
}

func startLogged(t *testing.T, bin, log string, env []string, args ...string) *loggedProc {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := &loggedProc{cmd: cmd, log: log, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitLine waits for a line starting with prefix in p's log and returns
// the rest of it.
func (p *loggedProc) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		b, _ := os.ReadFile(p.log)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, prefix); ok {
				return v
			}
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%v exited early: %v\n%s", p.cmd.Args, err, b)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v: no %q line:\n%s", p.cmd.Args, prefix, b)
		}
	}
}

// cmdline is what `ps` shows of a process.
func cmdline(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	return string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
}

// TestNoSecretsInLogsOrArgs runs a cluster of processes as an operator
// would — `rialto server` and two `rialto agent`s, every one logging at
// debug level, their tokens in files and the environment — and uses it
// through the CLI as a tenant: block (composed, attached), memory
// (memtest), accelerators (dedicated and shared), listings, a release and
// a node removal. It then collects every secret handed out — tokens, node
// credentials, agent keys, lease credentials, part export names, the node
// and CA private keys — and finds none in any log, in the output of the
// verbs that do not exist to show them, or in any process's command line.
func TestNoSecretsInLogsOrArgs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const (
		boot  = "rbt_e2e-bootstrap-0123456789abcdef"
		admin = "rat_e2e-admin-0123456789abcdef"
		alice = "rat_e2e-alice-0123456789abcdef"
	)
	secrets := map[string]string{"bootstrap token": boot, "admin token": admin, "alice's token": alice}
	srv := startLogged(t, bin, filepath.Join(dir, "server.log"), nil, "server", "--listen", "127.0.0.1:0",
		"--db", filepath.Join(dir, "cp.db"), "--tls-dir", filepath.Join(dir, "tls"),
		"--bootstrap-token-file", write("boot.token", boot), "--admin-token-file", write("admin.token", admin),
		"--token-file", write("tenants", alice+":alice"), "--heartbeat", "200ms", "--log-level", "debug")
	url := srv.waitLine(t, "rialto server: serving ")
	caFile := filepath.Join(dir, "tls", "ca-cert.pem")
	var agents []*loggedProc
	for i, name := range []string{"a1", "a2"} {
		env := []string{"RIALTO_ADDR=" + url, "RIALTO_CACERT=" + caFile}
		args := []string{"agent", "--name", name, "--state-dir", filepath.Join(dir, name), "--block", "disk0=disk0.img:32MiB",
			"--memory", "16MiB", "--accel", "2", "--slot-memory", "1MiB", "--log-level", "debug"}
		if i == 0 {
			env = append(env, "RIALTO_BOOTSTRAP_TOKEN="+boot)
		} else {
			args = append(args, "--bootstrap-token-file", filepath.Join(dir, "boot.token"))
		}
		agents = append(agents, startLogged(t, bin, filepath.Join(dir, name+".log"), env, args...))
	}

	hc, err := api.HTTPClient(caFile, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(url, admin, hc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	poll(t, "two ready nodes", 60*time.Second, func() bool {
		ns, err := cl.Nodes(ctx)
		ready := 0
		for _, n := range ns {
			if n.State == api.NodeReady {
				ready++
			}
		}
		return err == nil && ready == 2
	})

	// The tenant's CLI: the token in the environment for some verbs, in a
	// file for others; never on the command line.
	tenantEnv := []string{"RIALTO_ADDR=" + url, "RIALTO_CACERT=" + caFile}
	var quiet []string // outputs that must hold no secret
	cli := func(useFile bool, args ...string) string {
		t.Helper()
		env := tenantEnv
		if useFile {
			args = append(args, "--token-file", filepath.Join(dir, "tenants.alice"))
		} else {
			env = append(env, "RIALTO_TOKEN="+alice)
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("rialto %v: %v\n%s%s", args, err, stdout.String(), stderr.String())
		}
		quiet = append(quiet, fmt.Sprintf("stderr of rialto %v:\n%s", args, stderr.String()))
		return stdout.String()
	}
	write("tenants.alice", alice)
	var leases []api.Lease
	create := func(args ...string) api.Lease {
		t.Helper()
		var l api.Lease
		if err := json.Unmarshal([]byte(cli(false, append([]string{"lease", "create", "-o", "json"}, args...)...)), &l); err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		return l
	}
	blk := create("--kind", "block", "--mode", "composed", "--count", "2", "--size", "8MiB")
	mem := create("--kind", "memory", "--size", "4MiB")
	ded := create("--kind", "accel", "--role", "sha256")
	shared := create("--kind", "accel", "--mode", "shared", "--role", "sha256")

	// rialto attach, in the background, written and read through.
	att := startLogged(t, bin, filepath.Join(dir, "attach.log"), append(tenantEnv, "RIALTO_TOKEN="+alice, "XDG_RUNTIME_DIR="+dir),
		"attach", blk.ID, "--log-level", "debug")
	localURI := att.waitLine(t, "nbd+unix://")
	nc, err := nbd.DialURI(ctx, "nbd+unix://"+localURI)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("secret-free"), 100000)
	if _, err := nc.WriteAt(data, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := nc.ReadAt(got, 4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back through the attachment: %v", err)
	}
	nc.Close()

	quiet = append(quiet, cli(true, "memtest", mem.ID, "--span", "1MiB"))
	in := write("in.txt", "hello")
	quiet = append(quiet, cli(false, "accel", "run", ded.ID, "sha256", "@"+in, "--hex"))
	quiet = append(quiet, cli(true, "accel", "run", shared.ID, "sha256", "@"+in, "--hex"))
	quiet = append(quiet, cli(false, "leases"), cli(true, "nodes"), cli(false, "devices"), cli(true, "events", "--since", "0"))

	// What `ps` shows while everything runs.
	var cmdlines []string
	for _, p := range append([]*loggedProc{srv, att}, agents...) {
		cmdlines = append(cmdlines, cmdline(t, p.cmd.Process.Pid))
	}

	_ = att.cmd.Process.Signal(syscall.SIGTERM)
	<-att.done
	att.done <- nil
	for _, l := range leases {
		cli(true, "lease", "release", l.ID, "-o", "json")
	}
	// The admin removes a node that still heartbeats; it joins again.
	ns, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admEnv := []string{"RIALTO_ADDR=" + url, "RIALTO_CACERT=" + caFile}
	rm := exec.CommandContext(ctx, bin, "node", "remove", ns[0].Name, "--force", "--token-file", filepath.Join(dir, "admin.token"))
	rm.Env = append(os.Environ(), admEnv...)
	out, err := rm.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "removed") {
		t.Fatalf("node remove: %v\n%s", err, out)
	}
	quiet = append(quiet, string(out))
	poll(t, "the removed node back", 90*time.Second, func() bool {
		ns, err := cl.Nodes(ctx)
		ready := 0
		for _, n := range ns {
			if n.State == api.NodeReady {
				ready++
			}
		}
		return err == nil && ready == 2
	})
	// Its agent writes the join's answer, and keeps the credential it
	// replaced, once it has it.
	poll(t, "the removed node's agent to keep its previous credential", 30*time.Second, func() bool {
		var id struct {
			PreviousCredentials []string `json:"previous_credentials"`
		}
		b, err := os.ReadFile(filepath.Join(dir, ns[0].Name, "identity.json"))
		return err == nil && json.Unmarshal(b, &id) == nil && len(id.PreviousCredentials) > 0
	})

	// Every secret handed out.
	for i, l := range leases {
		secrets[fmt.Sprintf("lease %d's credential", i)] = l.Credential
		uris := []string{l.URI}
		for _, p := range l.Parts {
			uris = append(uris, p.URI)
		}
		for j, u := range uris {
			if u == "" {
				continue
			}
			path := u[strings.Index(u, "://")+3:]
			path = path[strings.Index(path, "/")+1:]
			path, _, _ = strings.Cut(path, "?")
			secrets[fmt.Sprintf("lease %d's export name %d", i, j)] = path
		}
	}
	for _, name := range []string{"a1", "a2"} {
		var id struct {
			Credential          string   `json:"credential"`
			PreviousCredentials []string `json:"previous_credentials"`
			AgentKey            string   `json:"agent_key"`
		}
		b, err := os.ReadFile(filepath.Join(dir, name, "identity.json"))
		if err != nil || json.Unmarshal(b, &id) != nil || id.Credential == "" || id.AgentKey == "" {
			t.Fatalf("%s identity: %v", name, err)
		}
		secrets[name+"'s node credential"], secrets[name+"'s agent key"] = id.Credential, id.AgentKey
		// Those its joins presented with it (the removed node's agent's
		// rejoin replaced one).
		for i, c := range id.PreviousCredentials {
			secrets[fmt.Sprintf("%s's previous node credential %d", name, i)] = c
		}
		secrets[name+"'s node key"] = pemBody(t, filepath.Join(dir, name, "node-key.pem"))
	}
	secrets["the CA key"] = pemBody(t, filepath.Join(dir, "tls", "ca-key.pem"))

	// None in the logs, the quiet outputs or the command lines.
	var where []string
	for _, f := range []string{"server.log", "a1.log", "a2.log", "attach.log"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			t.Fatalf("%s is empty: the logs checked must have something in them", f)
		}
		where = append(where, f+":\n"+string(b))
	}
	where = append(where, quiet...)
	for _, c := range cmdlines {
		where = append(where, "command line: "+c)
	}
	for what, s := range secrets {
		if len(s) < 16 {
			t.Fatalf("%s is too short to look for: %q", what, s)
		}
		for _, w := range where {
			if strings.Contains(w, s) {
				name, _, _ := strings.Cut(w, "\n")
				t.Errorf("%s found in %s", what, name)
			}
		}
	}
	// The debug logs did log the traffic (this test would pass on empty
	// logs otherwise).
	if b, _ := os.ReadFile(filepath.Join(dir, "server.log")); !bytes.Contains(b, []byte("node joined")) {
		t.Errorf("the server's log lacks its join lines")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a1.log")); !bytes.Contains(b, []byte("joined")) {
		t.Errorf("a1's log lacks its join line")
	}
}

// pemBody is the longest base64 line of a PEM file (a key's bytes).
func pemBody(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	best := ""
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "-----") && len(l) > len(best) {
			best = l
		}
	}
	return best
}
