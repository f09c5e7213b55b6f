package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// startAppliance runs `rialto appliance` in process against the cluster
// and waits until its node is ready.
func startAppliance(t *testing.T, c *testcluster.Cluster, name string, args ...string) api.Node {
	t.Helper()
	var out, errb syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan int, 1)
	args = append([]string{"appliance", "--control-plane", c.URL, "--bootstrap-token", testcluster.BootstrapToken,
		"--name", name, "--state-dir", filepath.Join(t.TempDir(), name), "--heartbeat", "100ms", "--log-level", "warn"}, args...)
	go func() { finished <- run(ctx, args, clusterEnv(c, t.TempDir(), &out, &errb)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Error("appliance did not stop")
		}
	})
	var node api.Node
	testcluster.Eventually(t, 30*time.Second, "appliance node ready", func() bool {
		select {
		case code := <-finished:
			t.Fatalf("appliance exited %d: %s", code, errb.String())
		default:
		}
		ns, err := c.Client().Nodes(context.Background())
		if err != nil {
			return false
		}
		for _, n := range ns {
			if n.Name == name && n.State == api.NodeReady {
				node = n
				return true
			}
		}
		return false
	})
	return node
}

func TestApplianceAndAccelRun(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	node := startAppliance(t, c, "appl1", "--slots", "2", "--slot-memory", "1MiB")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	devs, err := c.Client().Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var slots int64
	for _, d := range devs {
		if d.NodeID == node.ID {
			if d.Kind != api.KindAccel {
				t.Errorf("appliance lends a %s device", d.Kind)
			}
			slots += d.Capacity
		}
	}
	if slots != 2 {
		t.Fatalf("appliance lends %d slots, want 2", slots)
	}

	sha, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	if sha.NodeID != node.ID {
		t.Fatalf("accel lease on %s, not the appliance %s", sha.NodeID, node.ID)
	}
	echo, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()

	// sha256 of a literal, raw and hex.
	out, errs, code := runIn(t, c, runtime, "accel", "run", sha.ID, "sha256", "@hello, rialto")
	want := sha256.Sum256([]byte("hello, rialto"))
	if code != 0 || out != string(want[:]) {
		t.Fatalf("accel run sha256: exit %d, %x, %s", code, out, errs)
	}
	out, _, code = runIn(t, c, runtime, "accel", "run", sha.ID, "sha256:sum", "@hello, rialto", "--hex")
	if code != 0 || strings.TrimSpace(out) != hex.EncodeToString(want[:]) {
		t.Errorf("accel run --hex: %d %q", code, out)
	}

	// A file in, a file out, through echo; and sha256 of the same file.
	dir := t.TempDir()
	in := filepath.Join(dir, "in.bin")
	data := make([]byte, 200<<10)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	os.WriteFile(in, data, 0o600)
	outFile := filepath.Join(dir, "out.bin")
	if _, errs, code := runIn(t, c, runtime, "accel", "run", echo.ID, "echo", in, "--out", outFile); code != 0 {
		t.Fatalf("accel run echo: %d %s", code, errs)
	}
	if got, _ := os.ReadFile(outFile); !bytes.Equal(got, data) {
		t.Errorf("echo returned %d bytes, not the input", len(got))
	}
	out, _, code = runIn(t, c, runtime, "accel", "run", sha.ID, "sha256", in, "-o", "json")
	var res accelRunOut
	fileSum := sha256.Sum256(data)
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.ID != sha.ID || res.State != "ok" ||
		res.Entry != "sum" || !bytes.Equal(res.Output, fileSum[:]) {
		t.Errorf("accel run -o json: %d %s", code, out)
	}

	// stdin.
	stdinOf = func(*env) io.Reader { return strings.NewReader("from stdin") }
	t.Cleanup(func() { stdinOf = func(*env) io.Reader { return os.Stdin } })
	out, _, code = runIn(t, c, runtime, "accel", "run", echo.ID, "echo", "-")
	if code != 0 || out != "from stdin" {
		t.Errorf("accel run from stdin: %d %q", code, out)
	}

	blk, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"accel", "run", sha.ID, "fft", "@x"}, 1, `runs role "sha256", not "fft"`},
		{[]string{"accel", "run", sha.ID, "sha256:open", "@x"}, 1, `no entry "open"`},
		{[]string{"accel", "run", blk.ID, "sha256", "@x"}, 1, "needs an accel lease"},
		{[]string{"accel", "run", sha.ID, "sha256", filepath.Join(dir, "missing")}, 1, "input:"},
		{[]string{"accel", "run", sha.ID, "sha256"}, 2, "wrong number of arguments"},
		{[]string{"accel", "run", sha.ID, "sha256", "@x", "--slot", "3"}, 1, "has 1 slot"},
	} {
		_, errs, code := runIn(t, c, runtime, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}

	// Released, the slot is free again and the credential is dead.
	if _, err := c.Client().ReleaseLease(ctx, sha.ID); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runIn(t, c, runtime, "accel", "run", sha.ID, "sha256", "@x"); code != 1 || !strings.Contains(errs, "not active") {
		t.Errorf("accel run on a released lease: %d %s", code, errs)
	}
}

func TestApplianceFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"appliance"}, 1, "bootstrap token is required"},
		{[]string{"appliance", "--bootstrap-token", "x", "--slots", "0"}, 1, "--slots"},
		{[]string{"appliance", "--bootstrap-token", "x", "--slot-memory", "big"}, 1, "bad --slot-memory"},
		{[]string{"appliance", "--frob"}, 2, "flag provided but not defined"},
	} {
		_, errs, code := runCLI(t, "http://127.0.0.1:1", tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

func TestParseAccelURI(t *testing.T) {
	tg, err := parseAccelURI("rialto-accel://127.0.0.1:5/cred?slots=127.0.0.1:6,127.0.0.1:7")
	if err != nil || tg.credential != "cred" || strings.Join(tg.slots, " ") != "127.0.0.1:5 127.0.0.1:6 127.0.0.1:7" {
		t.Errorf("parseAccelURI: %+v %v", tg, err)
	}
	for _, bad := range []string{"rialto-accel://127.0.0.1:5/", "nbd://127.0.0.1:5/x", "rialto-accel:///x"} {
		if _, err := parseAccelURI(bad); err == nil {
			t.Errorf("parseAccelURI(%q) accepted", bad)
		}
	}
}
