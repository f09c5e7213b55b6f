package main

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// startAppliance runs `rialto appliance` in process against the cluster
// and waits until its node is ready.
func startAppliance(t *testing.T, c *testcluster.Cluster, name string, args ...string) (api.Node, *logtest.Buffer) {
	t.Helper()
	var out, errb logtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan int, 1)
	trust := []string{"--insecure-dataplane"}
	if c.CA != nil {
		trust = []string{"--cacert", c.CA.CertFile()}
	}
	args = append(append([]string{"appliance", "--addr", c.URL, "--bootstrap-token-file", secretFileOf(t, testcluster.BootstrapToken),
		"--name", name, "--state-dir", filepath.Join(t.TempDir(), name), "--heartbeat", "100ms", "--log-level", "warn"}, trust...), args...)
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
	return node, &out
}

func TestApplianceAndAccelRun(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	node, _ := startAppliance(t, c, "appl1", "--slots", "2", "--slot-memory", "1MiB")
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
			slots += d.Capacity / api.SlotUnits
		}
	}
	if slots != 2 {
		t.Fatalf("appliance lends %d slots, want 2", slots)
	}

	sha, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
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
	out, errs, code := runIn(t, c, runtime, "accel", "run", sha.ID, "sha256", "--data", "hello, rialto")
	want := sha256.Sum256([]byte("hello, rialto"))
	if code != 0 || out != string(want[:]) {
		t.Fatalf("accel run sha256: exit %d, %x, %s", code, out, errs)
	}
	out, _, code = runIn(t, c, runtime, "accel", "run", sha.ID, "sha256:sum", "--data", "hello, rialto", "--hex")
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
		{[]string{"accel", "run", sha.ID, "fft", "--data", "x"}, 1, `runs role "sha256", not "fft"`},
		{[]string{"accel", "run", sha.ID, "sha256:open", "--data", "x"}, 1, `no entry "open"`},
		{[]string{"accel", "run", blk.ID, "sha256", "--data", "x"}, 1, "needs an accel lease"},
		{[]string{"accel", "run", sha.ID, "sha256", filepath.Join(dir, "missing")}, 1, "input:"},
		// Text where a file is expected: the error points at --data.
		{[]string{"accel", "run", sha.ID, "sha256", "hello"}, 1, "for the text itself, use --data hello"},
		{[]string{"accel", "run", sha.ID, "sha256"}, 2, "give one of INPUT, --data and --input-lease"},
		{[]string{"accel", "run", sha.ID, "sha256", "--data", "x", "--slot", "3"}, 1, "has 1 slot"},
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
	if _, errs, code := runIn(t, c, runtime, "accel", "run", sha.ID, "sha256", "--data", "x"); code != 1 || !strings.Contains(errs, "not active") {
		t.Errorf("accel run on a released lease: %d %s", code, errs)
	}
}

func TestApplianceFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"appliance"}, 2, "bootstrap token is required"},
		{[]string{"appliance", "--bootstrap-token", "x"}, 2, "--bootstrap-token puts a secret on the command line"},
		{[]string{"appliance", "--bootstrap-token-file", secretFileOf(t, "x")}, 2, "--cacert or RIALTO_CACERT"},
		{[]string{"appliance", "--bootstrap-token-file", secretFileOf(t, "x"), "--insecure-dataplane", "--slots", "0"}, 2, "--slots"},
		{[]string{"appliance", "--bootstrap-token-file", secretFileOf(t, "x"), "--insecure-dataplane", "--slot-memory", "big"}, 2, `invalid argument "big" for "--slot-memory"`},
		{[]string{"appliance", "--frob"}, 2, "unknown flag: --frob"},
	} {
		_, errs, code := runCLI(t, "http://127.0.0.1:1", tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

// managementOf reads the management URL and token file `rialto appliance`
// printed.
func managementOf(t *testing.T, out *logtest.Buffer) (base, token string) {
	t.Helper()
	var line string
	testcluster.Eventually(t, 10*time.Second, "management API line", func() bool {
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.Contains(l, "management API on ") {
				line = l
				return true
			}
		}
		return false
	})
	rest := line[strings.Index(line, "http://"):]
	base, rest, _ = strings.Cut(rest, " ")
	file := strings.TrimSuffix(strings.TrimPrefix(rest, "(bearer token in "), ")")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("token file from %q: %v", line, err)
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v", fi.Mode())
	}
	return base, strings.TrimSpace(string(b))
}

func mgmtDo(t *testing.T, method, url, token string, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestApplianceManagementAPI(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	_, out := startAppliance(t, c, "appl-m", "--slots", "3", "--slot-memory", "1MiB")
	base, token := managementOf(t, out)
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Errorf("management API on %s, not loopback", base)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The token is required.
	for _, tok := range []string{"", "wrong"} {
		if code, b := mgmtDo(t, "GET", base+"/v1/slots", tok, ""); code != http.StatusUnauthorized || !strings.Contains(string(b), "unauthorized") {
			t.Errorf("token %q: %d %s", tok, code, b)
		}
	}
	if code, _ := mgmtDo(t, "GET", base+"/v1/gateways", "", ""); code != http.StatusUnauthorized {
		t.Errorf("gateways without a token: %d", code)
	}
	mc := appliance.NewClient(base, token, nil)
	slots, err := mc.Slots(ctx)
	if err != nil || len(slots) != 3 {
		t.Fatalf("slots: %+v %v", slots, err)
	}

	// A lease made through the control plane shows in the slot list.
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"})
	if err != nil {
		t.Fatal(err)
	}
	slots, _ = mc.Slots(ctx)
	leased := -1
	for _, s := range slots {
		if s.Leased {
			if leased >= 0 || s.Role != "sha256" {
				t.Fatalf("slots after one lease: %+v", slots)
			}
			leased = s.ID
		}
	}
	if leased < 0 {
		t.Fatalf("no leased slot: %+v", slots)
	}
	free := (leased + 1) % 3

	// Load, reset and unload a role on a free slot; the leased one is untouched.
	st, err := mc.Load(ctx, free, roles.Spec{Name: "echo"})
	if err != nil || st.Role != "echo" {
		t.Fatalf("load: %+v %v", st, err)
	}
	if err := mc.Reset(ctx, free); err != nil {
		t.Fatal(err)
	}
	if code, b := mgmtDo(t, "PUT", fmt.Sprintf("%s/v1/slots/%d/role", base, free), token, `{"name":"no-such-role"}`); code != http.StatusBadRequest || !strings.Contains(string(b), "unknown_role") {
		t.Errorf("unknown role: %d %s", code, b)
	}
	if err := mc.Unload(ctx, free); err != nil {
		t.Fatal(err)
	}
	if s, _ := mc.Slots(ctx); s[free].Role != "" || s[leased].Role != "sha256" || !s[leased].Leased {
		t.Fatalf("after unload: %+v", s)
	}
	// Lease credentials belong to the control plane.
	if err := mc.SetCredential(ctx, free, []byte("mine")); err == nil || !strings.Contains(err.Error(), "managed") {
		t.Errorf("set credential through the management API: %v", err)
	}
	if code, _ := mgmtDo(t, "DELETE", fmt.Sprintf("%s/v1/slots/%d/credential", base, leased), token, ""); code != http.StatusConflict {
		t.Errorf("clearing a lease's credential: %d", code)
	}
	// The lease still works, over the accel protocol and the HTTP call.
	runtime := t.TempDir()
	if o, errs, code := runIn(t, c, runtime, "accel", "run", l.ID, "sha256", "--data", "abc", "--hex"); code != 0 || !strings.HasPrefix(o, "ba7816bf") {
		t.Fatalf("accel run: %d %q %s", code, o, errs)
	}
	cred := l.URI[strings.LastIndex(l.URI, "/")+1:]
	req, _ := http.NewRequest("POST", fmt.Sprintf("%s/v1/slots/%d/call/sum", base, leased), strings.NewReader("abc"))
	req.Header.Set("Rialto-Lease-Credential", cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := sha256.Sum256([]byte("abc")); resp.StatusCode != 200 || !bytes.Equal(sum, want[:]) {
		t.Errorf("HTTP call: %d %x", resp.StatusCode, sum)
	}

	// A shared lease's gateway is listed, with its stats; metrics and health.
	sh, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runIn(t, c, runtime, "accel", "run", sh.ID, "echo", "--data", "hi"); code != 0 {
		t.Fatalf("accel run shared: %s", errs)
	}
	code, b := mgmtDo(t, "GET", base+"/v1/gateways", token, "")
	var gws []agent.GatewayStatus
	if code != 200 || json.Unmarshal(b, &gws) != nil || len(gws) != 1 || gws[0].Role != "echo" || gws[0].Leases != 1 || gws[0].Stats.Items != 1 {
		t.Fatalf("gateways: %d %s", code, b)
	}
	code, b = mgmtDo(t, "GET", base+"/metrics", token, "")
	if code != 200 || !strings.Contains(string(b), "rialto_gateway_executions_total") || !strings.Contains(string(b), "rialto_accel_slot_tasks_total") {
		t.Errorf("metrics: %d %.300s", code, b)
	}
	if h, err := mc.Health(ctx); err != nil || !h.Healthy || len(h.Slots) != 3 {
		t.Errorf("health: %+v %v", h, err)
	}
}

func TestAccelLeaseRoleConfigCLI(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	startAppliance(t, c, "appl-k", "--slots", "2", "--slot-memory", "1MiB", "--management", "off")
	dir := t.TempDir()
	key := bytes.Repeat([]byte{0x5a}, 32)
	keyFile := filepath.Join(dir, "key.bin")
	os.WriteFile(keyFile, key, 0o600)
	runtime := t.TempDir()
	nonce := "twelve bytes"
	b, _ := aes.NewCipher(key)
	g, _ := cipher.NewGCM(b)
	for _, mode := range []string{"dedicated", "shared"} {
		args := []string{"lease", "create", "--kind", "accel", "--role", "aesgcm", "--role-config", keyFile, "-o", "json"}
		if mode == "shared" {
			args = append(args, "--mode", "shared")
		}
		o, errs, code := runIn(t, c, runtime, args...)
		var l api.Lease
		if code != 0 || json.Unmarshal([]byte(o), &l) != nil {
			t.Fatalf("%s: lease create: %d %s %s", mode, code, o, errs)
		}
		if strings.Contains(o, base64.StdEncoding.EncodeToString(key)) || strings.Contains(o, "role_config") {
			t.Errorf("%s: the lease shows its role config: %s", mode, o)
		}
		if got := strings.Contains(l.URI, "gateway=aesgcm"); got != (mode == "shared") {
			t.Errorf("%s lease URI %s", mode, l.URI)
		}
		// The input is binary (a nonce, then the text): a file, @FILE.
		in := filepath.Join(t.TempDir(), "in")
		if err := os.WriteFile(in, []byte(nonce+"plain text"), 0o600); err != nil {
			t.Fatal(err)
		}
		o, errs, code = runIn(t, c, runtime, "accel", "run", l.ID, "aesgcm:seal", "@"+in, "-o", "json")
		var res accelRunOut
		if code != 0 || json.Unmarshal([]byte(o), &res) != nil {
			t.Fatalf("%s: accel run: %d %s %s", mode, code, o, errs)
		}
		if pt, err := g.Open(nil, []byte(nonce), res.Output, nil); err != nil || string(pt) != "plain text" {
			t.Errorf("%s: output not sealed with the lease's key: %v", mode, err)
		}
		if want := map[string]string{"dedicated": "slot", "shared": "gateway"}[mode]; res.Via != want {
			t.Errorf("%s: via %q", mode, res.Via)
		}
		if _, err := c.Client().ReleaseLease(context.Background(), l.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Refusals: config without a role, a bad key, an oversized file.
	big := filepath.Join(dir, "big.bin")
	os.WriteFile(big, make([]byte, api.MaxRoleConfig+1), 0o600)
	bad := filepath.Join(dir, "bad.bin")
	os.WriteFile(bad, []byte("not-a-key"), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--role-config", keyFile}, "need --role"},
		{[]string{"--role", "aesgcm", "--role-config", big}, "larger than"},
		{[]string{"--role", "aesgcm", "--role-config", bad}, "key"},
		{[]string{"--mode", "shared"}, "give a role"},
	} {
		_, errs, code := runIn(t, c, runtime, append([]string{"lease", "create", "--kind", "accel"}, tc.args...)...)
		if code == 0 || !strings.Contains(errs, tc.want) || strings.Contains(errs, "not-a-key") {
			t.Errorf("%v: exit %d, %q; want %q", tc.args, code, errs, tc.want)
		} else {
			t.Logf("%v: %s", tc.args, errs)
		}
	}
}
