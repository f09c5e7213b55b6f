package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/filelock"
	"github.com/rialto-project/rialto/internal/rack"
	"github.com/rialto-project/rialto/internal/uptest"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pki"
)

func TestMain(m *testing.M) {
	// A memory mapping's fault handler is the test binary re-executed.
	mapping.RunFaultHandlerIfChild()
	uptest.Main(m)
}

// buildBinary builds rialto once per test run.
func buildBinary(t *testing.T) string { return uptest.Binary(t) }

// upProc is a running `rialto up`.
type upProc struct{ *uptest.Up }

// startUp starts `rialto up` with 512 MiB disks and no memory lending, and
// extra flags; it stops when the test ends.
func startUp(t *testing.T, bin, dir string, extra ...string) *upProc {
	t.Helper()
	return &upProc{uptest.StartUp(t, bin, dir, append([]string{"--disk-size", "512MiB", "--memory", "0"}, extra...)...)}
}

// cli runs a verb of the binary against the cluster and decodes -o json.
func (p *upProc) cli(t *testing.T, bin string, out any, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, append(args, "-o", "json")...)
	cmd.Env = p.Env()
	b, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("rialto %v: %v\n%s", args, err, stderr)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("rialto %v: %v\n%s", args, err, b)
	}
}

// TestUpREADMEFlow runs the README's tour against a real `rialto up`
// process, then restarts it on the same state dir.
func TestUpREADMEFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := filepath.Join(t.TempDir(), "state")
	up := startUp(t, bin, dir)
	caFile := filepath.Join(dir, "tls", "ca-cert.pem")
	for _, want := range []string{"API:", "node1", "disk0", "export RIALTO_ADDR=https://127.0.0.1:", "export RIALTO_CACERT=" + caFile + "\n"} {
		if !strings.Contains(up.Output(), want) {
			t.Errorf("banner lacks %q:\n%s", want, up.Output())
		}
	}
	// The env file (written after the banner) points at the CA, and the
	// API verifies against it with curl.
	poll(t, "the env file", 10*time.Second, func() bool {
		env, err := os.ReadFile(filepath.Join(dir, "env"))
		return err == nil && strings.Contains(string(env), "export RIALTO_CACERT="+caFile+"\n")
	})
	if st, err := os.Stat(filepath.Join(dir, "tls", "ca-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("ca-key.pem: %v %v", st, err)
	}
	if _, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command("curl", "-sS", "--fail", "--cacert", up.CACert, "-H", "Authorization: Bearer "+up.Token, up.Addr+"/v1/nodes").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "node1") {
			t.Fatalf("curl --cacert %s: %v\n%s", up.Addr, err, out)
		}
	}

	// A second cluster on the same state dir is refused.
	out, err := exec.Command(bin, "up", "--state-dir", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by another rialto up") {
		t.Errorf("second rialto up on the same state dir: %v\n%s", err, out)
	}

	var nodes []api.Node
	up.cli(t, bin, &nodes, "nodes")
	if len(nodes) != 3 {
		t.Fatalf("%d nodes", len(nodes))
	}
	for _, n := range nodes {
		if n.State != api.NodeReady {
			t.Errorf("node %s is %s", n.Name, n.State)
		}
		// Enrolled: the agents serve their API over mutual TLS.
		if !strings.HasPrefix(n.AgentURL, "https://") {
			t.Errorf("node %s agent URL %s", n.Name, n.AgentURL)
		}
		if _, err := os.Stat(filepath.Join(dir, n.Name, "node-cert.pem")); err != nil {
			t.Errorf("node %s: %v", n.Name, err)
		}
	}
	var l api.Lease
	up.cli(t, bin, &l, "lease", "create", "--kind", "block", "--size", "256MiB")
	// The data planes require TLS by default: the lease is nbds://, and
	// nbdinfo reaches it with the cluster CA's directory.
	if l.State != api.LeaseActive || l.NodeID == "" || l.DeviceID == "" || !strings.HasPrefix(l.URI, "nbds://") {
		t.Fatalf("lease %+v", l)
	}
	if nbdinfo, err := exec.LookPath("nbdinfo"); err == nil {
		tlsDir := filepath.Join(dir, "tls")
		if out, err := exec.Command(nbdinfo, "--size", l.URI+"?tls-certificates="+tlsDir).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "268435456" {
			t.Errorf("nbdinfo over TLS: %v %s", err, out)
		}
		if err := exec.Command(nbdinfo, "--size", "nbd://"+strings.TrimPrefix(l.URI, "nbds://")).Run(); err == nil {
			t.Error("nbdinfo in plaintext was served")
		}
	}
	var rel api.Lease
	up.cli(t, bin, &rel, "lease", "release", l.ID)
	if rel.State != api.LeaseReleased {
		t.Fatalf("released lease is %s", rel.State)
	}

	var acc api.Lease
	up.cli(t, bin, &acc, "lease", "create", "--kind", "accel", "--role", "echo")
	if acc.State != api.LeaseActive || !strings.HasPrefix(acc.URI, "rialto-accels://") {
		t.Fatalf("accel lease %+v", acc)
	}
	up.cli(t, bin, &rel, "lease", "release", acc.ID)
	// The banner's accelerator tour: a shared lease through the gateway.
	if !strings.Contains(up.Output(), "rialto accel run LEASE-ID sha256 --data hello --hex") {
		t.Errorf("banner lacks the accel tour:\n%s", up.Output())
	}
	up.cli(t, bin, &acc, "lease", "create", "--kind", "accel", "--mode", "shared", "--role", "sha256")
	if acc.State != api.LeaseActive || !strings.Contains(acc.URI, "?gateway=sha256") {
		t.Fatalf("shared accel lease %+v", acc)
	}
	var ran accelRunOut
	up.cli(t, bin, &ran, "accel", "run", acc.ID, "sha256", "--data", "hello")
	if sum := sha256.Sum256([]byte("hello")); ran.Via != "gateway" || !bytes.Equal(ran.Output, sum[:]) {
		t.Fatalf("accel run through the gateway: %+v", ran)
	}
	up.cli(t, bin, &rel, "lease", "release", acc.ID)

	// A lease left active survives a restart of the whole cluster.
	var kept api.Lease
	up.cli(t, bin, &kept, "lease", "create", "--kind", "block", "--size", "64MiB", "--ttl", "1h")
	up.Stop(t)
	if st, err := os.Stat(filepath.Join(dir, "cluster.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("cluster.json: %v %v", st, err)
	}

	up2 := startUp(t, bin, dir)
	if up2.Addr != up.Addr || up2.Token != up.Token {
		t.Errorf("restart changed address or token: %s -> %s", up.Addr, up2.Addr)
	}
	up2.cli(t, bin, &nodes, "nodes")
	if len(nodes) != 3 {
		t.Fatalf("after restart: %d nodes", len(nodes))
	}
	var devs []api.Device
	up2.cli(t, bin, &devs, "devices")
	if len(devs) != 9 {
		t.Fatalf("after restart: %d devices", len(devs))
	}
	var again api.Lease
	up2.cli(t, bin, &again, "lease", "show", kept.ID)
	if again.State != api.LeaseActive {
		t.Fatalf("kept lease is %s after restart (%s)", again.State, again.Reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dataTLS, err := pki.LoadClientTLS(up2.CACert)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nbd.DialURI(ctx, again.URI, nbd.WithTLS(dataTLS))
	if err != nil {
		t.Fatalf("kept lease's URI after restart: %v", err)
	}
	c.Close()
	up2.Stop(t)
}

// TestUpQuota: `rialto up --quota` limits the cluster's tenant like
// `rialto server --quota`: with leases=1, the second lease is refused with
// the quota error and the first is untouched.
func TestUpQuota(t *testing.T) {
	bin := buildBinary(t)
	up := startUp(t, bin, t.TempDir(), "--quota", "leases=1")
	var l api.Lease
	up.cli(t, bin, &l, "lease", "create", "--kind", "block", "--size", "16MiB")
	cmd := exec.Command(bin, "lease", "create", "--kind", "block", "--size", "16MiB")
	cmd.Env = up.Env()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), api.CodeQuota) {
		t.Fatalf("second lease under leases=1: %v\n%s", err, out)
	}
	var got api.Lease
	up.cli(t, bin, &got, "lease", "show", l.ID)
	if got.State != api.LeaseActive {
		t.Fatalf("first lease is %s", got.State)
	}
	up.Stop(t)
}

// TestUpInsecureDataplane: `rialto up --insecure-dataplane` is the
// trusted-fabric opt-out: its leases are plaintext (nbd://, rialto-mem://,
// rialto-accel://), their credentials still checked, and it says so.
func TestUpInsecureDataplane(t *testing.T) {
	bin := buildBinary(t)
	up := startUp(t, bin, t.TempDir(), "--insecure-dataplane", "--agents", "1", "--memory", "16MiB")
	var l api.Lease
	up.cli(t, bin, &l, "lease", "create", "--kind", "block", "--size", "16MiB")
	if !strings.HasPrefix(l.URI, "nbd://") {
		t.Fatalf("block lease with --insecure-dataplane: %s", strings.SplitN(l.URI, "/", 4)[2])
	}
	var m api.Lease
	up.cli(t, bin, &m, "lease", "create", "--kind", "memory", "--size", "1MiB")
	if !strings.HasPrefix(m.URI, "rialto-mem://") {
		t.Fatalf("memory lease with --insecure-dataplane: %s", strings.SplitN(m.URI, ":", 2)[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := nbd.ParseURI(l.URI)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nbd.Dial(ctx, u.Network, u.Address, u.Export)
	if err != nil {
		t.Fatalf("plaintext NBD: %v", err)
	}
	c.Close()
	if _, err := nbd.Dial(ctx, u.Network, u.Address, u.Export+"x"); !errors.Is(err, nbd.ErrExportNotFound) {
		t.Fatalf("a wrong export name: %v", err)
	}
	up.Stop(t)
}

// TestUpStopsPromptly: an idle `rialto up` stops within a bound of SIGTERM.
// It used to take over a second: the connection its banner's client left
// idle, and those of its agents, held the control plane's graceful
// shutdown until the server gave up on them (HTTP/2 waits a second after
// its GOAWAY for clients to hang up).
func TestUpStopsPromptly(t *testing.T) {
	bin := buildBinary(t)
	up := startUp(t, bin, t.TempDir(), "--agents", "2")
	var nodes []api.Node
	up.cli(t, bin, &nodes, "nodes")
	start := time.Now()
	up.Stop(t)
	if took, bound := time.Since(start), 600*time.Millisecond; took > bound {
		t.Errorf("rialto up took %v to stop (bound %v)", took, bound)
	} else {
		t.Logf("rialto up stopped in %v", took)
	}
}

// TestUpBadFlags: flags out of range are usage mistakes (exit 2, one line
// naming the flag) refused before anything starts or is written: a port
// out of range said only "listen tcp: address 99999: invalid port" (exit
// 1), a negative --accel and a --disks in the thousands were taken (the
// latter failed with "too many open files" after creating thousands of
// disk images). A --state-dir that is a file, or whose cluster.json is
// damaged, is refused (exit 1, one line) saying what is wrong with which
// path and what to do, and left as it was: they said only "mkdir F: not a
// directory" and "F/cluster.json: unexpected end of JSON input".
func TestUpBadFlags(t *testing.T) {
	bin := buildBinary(t)
	const notJSON = `{"bootstrap_token": "rbt_x", "port": 1`
	for _, tc := range []struct {
		args []string
		want []string // DIR stands for --state-dir
		code int      // 2 unless said
		// what is there before: content written at path (under
		// --state-dir's parent); it must be left as it was
		path, content string
	}{
		{args: []string{"--port", "99999"}, want: []string{"--port must be 0 to 65535"}},
		{args: []string{"--port", "-1"}, want: []string{"--port must be 0 to 65535"}},
		{args: []string{"--netns", "--port", "70000"}, want: []string{"--port must be 0 to 65535"}},
		{args: []string{"--accel", "-1"}, want: []string{"--accel must not be negative"}},
		{args: []string{"--disks", "65"}, want: []string{"--disks: at most 64 per node"}},
		{path: "state", content: "a file\n", code: 1,
			want: []string{"state dir DIR exists and is not a directory: give --state-dir a directory, or a path to create"}},
		{args: []string{"--state-dir", "DIR/sub"}, path: "state", content: "a file\n", code: 1,
			want: []string{"state dir DIR/sub cannot be made: DIR exists and is not a directory"}},
		{path: "state/cluster.json", content: notJSON, code: 1,
			want: []string{"DIR/cluster.json is not valid JSON (unexpected end of JSON input)", "remove it and run rialto up again"}},
		{path: "state/cluster.json", content: `{"port": "7070"}`, code: 1,
			want: []string{"DIR/cluster.json is not the JSON rialto up writes (json: cannot unmarshal string", "remove it and run rialto up again"}},
	} {
		parent := t.TempDir()
		dir := filepath.Join(parent, "state")
		if tc.path != "" {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(parent, tc.path)), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(parent, tc.path), []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		code := cmp.Or(tc.code, 2)
		args := []string{"up", "--state-dir", dir}
		for _, a := range tc.args {
			args = append(args, strings.ReplaceAll(a, "DIR", dir))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		msg := strings.TrimSuffix(stderr.String(), "\n")
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != code || strings.Contains(msg, "\n") {
			t.Errorf("%v: %v, stderr %q; want exit %d and one line", tc.args, err, msg, code)
		}
		for _, w := range tc.want {
			if w = strings.ReplaceAll(w, "DIR", dir); !strings.Contains(msg, w) {
				t.Errorf("%v: stderr %q lacks %q", args, msg, w)
			}
		}
		if tc.path == "" {
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("%v: the state dir was created", tc.args)
			}
		} else if b, err := os.ReadFile(filepath.Join(parent, tc.path)); err != nil || string(b) != tc.content {
			t.Errorf("%v: %s was changed: %q, %v", args, tc.path, b, err)
		}
	}
}

// TestUpBusyStateDirAndPort: a state dir another process holds and a
// --port another program listens on are refused, each in one line that
// names the holder or the port and what to do, and the refused runs leave
// the state dir as it was; a port the state dir used last time that
// another program took since is replaced by a free one, and rialto up says
// so on stderr (the RIALTO_ADDR exported for the last run is stale). Both
// refusals said only what was wrong ("in use by another rialto up",
// "listen tcp 127.0.0.1:P: bind: address already in use"), and the new
// port came with no word.
func TestUpBusyStateDirAndPort(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	// What the last run left: the port it served on.
	last := fmt.Sprintf("{\"port\": %d}\n", port)
	if err := os.WriteFile(filepath.Join(dir, "cluster.json"), []byte(last), 0o600); err != nil {
		t.Fatal(err)
	}
	refused := func(want []string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"up", "--state-dir", dir}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		msg := strings.TrimSuffix(stderr.String(), "\n")
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || strings.Contains(msg, "\n") {
			t.Errorf("%v: %v, stderr %q; want exit 1 and one line", args, err, msg)
		}
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Errorf("%v: stderr %q lacks %q", args, msg, w)
			}
		}
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "cluster.json")); string(b) != last || len(names) > 3 {
			t.Errorf("%v: the refused run changed the state dir: cluster.json %q, entries %v", args, b, names)
		}
	}

	// The state dir, held by this process as another rialto up holds it.
	lock, err := filelock.Open(filepath.Join(dir, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	inUse := []string{"state dir " + dir + " is in use by another rialto up", fmt.Sprintf("(pid %d", os.Getpid()),
		fmt.Sprintf("kill -INT %d", os.Getpid()), "another --state-dir"}
	refused(inUse)
	if os.Geteuid() == 0 && rack.Available() == nil {
		refused(inUse, "--netns")
	}
	filelock.Close(lock)

	refused([]string{fmt.Sprintf("--port %d: 127.0.0.1:%d is in use by another program", port, port), "leave --port out"}, "--port", strconv.Itoa(port))

	// The remembered port is taken: a free one, said on stderr before the
	// banner. (The banner counts its one agent as one: it said "1 agents".)
	cmd := exec.Command(bin, "up", "--state-dir", dir, "--agents", "1", "--disks", "1", "--disk-size", "64MiB", "--memory", "0", "--accel", "0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var addr, first string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if first == "" {
			first = sc.Text()
		}
		if v, ok := strings.CutPrefix(sc.Text(), "export RIALTO_ADDR="); ok {
			addr = v
			break
		}
	}
	cmd.Process.Signal(os.Interrupt)
	io.Copy(io.Discard, stdout) // until it exits
	if err := cmd.Wait(); err != nil {
		t.Errorf("rialto up after SIGINT: %v\n%s", err, stderr.String())
	}
	if want := "Rialto is up: a control plane and 1 agent on loopback."; first != want {
		t.Errorf("banner's first line %q, want %q", first, want)
	}
	warning, _, _ := strings.Cut(stderr.String(), "\n")
	if !strings.Contains(warning, fmt.Sprintf("port %d, which this state dir used last time, is taken", port)) ||
		!strings.Contains(warning, "export lines") {
		t.Errorf("rialto up with its port taken: stderr %q", stderr.String())
	}
	if i := strings.LastIndex(addr, ":"); i < 0 || addr[i+1:] == strconv.Itoa(port) || !strings.Contains(warning, "port "+addr[i+1:]+" now") {
		t.Errorf("rialto up with its port taken serves at %q; its warning: %q", addr, warning)
	}
}
