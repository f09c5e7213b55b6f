package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// clusterEnv is an env for verbs against a testcluster, with its own
// runtime directory for attach state.
func clusterEnv(c *testcluster.Cluster, runtime string, out, errw *logtest.Buffer) *env {
	return &env{stdout: out, stderr: errw, getenv: func(k string) string {
		switch k {
		case "RIALTO_ADDR":
			return c.URL
		case "RIALTO_TOKEN":
			return testcluster.AdminToken
		case "XDG_RUNTIME_DIR":
			return runtime
		}
		return ""
	}}
}

// runIn runs a verb to completion in process against a testcluster.
func runIn(t *testing.T, c *testcluster.Cluster, runtime string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb logtest.Buffer
	code := run(context.Background(), args, clusterEnv(c, runtime, &out, &errb))
	return out.String(), errb.String(), code
}

// attached runs `rialto attach` in process and returns the URI it printed
// and a channel with its exit code.
func attached(t *testing.T, c *testcluster.Cluster, runtime string, args ...string) (string, <-chan int) {
	t.Helper()
	uri, done, _ := attachedErr(t, c, runtime, args...)
	return uri, done
}

// attachedErr is attached, and returns what attach writes on stderr too
// (its log).
func attachedErr(t *testing.T, c *testcluster.Cluster, runtime string, args ...string) (string, <-chan int, *logtest.Buffer) {
	t.Helper()
	var out, errb logtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		done <- run(ctx, append([]string{"attach"}, args...), clusterEnv(c, runtime, &out, &errb))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Error("attach did not stop")
		}
	})
	var uri string
	testcluster.Eventually(t, 30*time.Second, "attach prints its URI", func() bool {
		select {
		case code := <-done:
			t.Fatalf("attach exited %d: %s", code, errb.String())
		default:
		}
		line, _, ok := strings.Cut(out.String(), "\n")
		uri = line
		return ok
	})
	return uri, done, &errb
}

// awaitExit returns the exit code attach sends on done, failing the test
// if it has not exited within 20 s (after: what should have stopped it).
func awaitExit(t *testing.T, done <-chan int, after string) int {
	t.Helper()
	select {
	case code := <-done:
		return code
	case <-time.After(20 * time.Second):
		t.Fatalf("attach still running after %s", after)
		return 0
	}
}

func TestAttachComposedLease(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 48 << 20, StripeUnit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Parts) != 3 {
		t.Fatalf("composed lease has %d parts", len(l.Parts))
	}
	runtime := t.TempDir()
	uri, done := attached(t, c, runtime, l.ID)
	sock := filepath.Join(runtime, "rialto", l.ID+".nbd")
	if u, err := url.Parse(uri); err != nil || u.Scheme != "nbd+unix" || u.Host != "" || len(u.Path) < 2 || u.Query().Get("socket") != sock {
		t.Fatalf("attach printed %q (%v), want nbd+unix:///NAME?socket=%s", uri, err, sock)
	}
	st, err := os.Stat(filepath.Join(runtime, "rialto", l.ID+".json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", st, err)
	}

	// Write through the attached volume; read back, and find the second
	// stripe unit on part 1.
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	if nc.Size() < l.Size {
		t.Errorf("attached volume is %d bytes, lease %d", nc.Size(), l.Size)
	}
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	if _, err := nc.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := nc.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back through the attachment: %v", err)
	}
	nc.Close()
	p1, err := nbd.DialURI(ctx, l.Parts[1].URI)
	if err != nil {
		t.Fatal(err)
	}
	unit := make([]byte, 64<<10)
	if _, err := p1.ReadAt(unit, 0); err != nil || !bytes.Equal(unit, want[64<<10:128<<10]) {
		t.Errorf("part 1 does not hold the second stripe unit: %v", err)
	}
	p1.Close()

	// A second attach of the same lease is refused while the first runs.
	if _, errs, code := runIn(t, c, runtime, "attach", l.ID); code != 1 || !strings.Contains(errs, "already attached") {
		t.Errorf("second attach: exit %d, %s", code, errs)
	}

	// A real client through the attachment: nbdcopy in and out.
	if nbdcopy, err := exec.LookPath("nbdcopy"); err == nil {
		dir := t.TempDir()
		in, outf := filepath.Join(dir, "in"), filepath.Join(dir, "out")
		data := make([]byte, 8<<20)
		for i := range data {
			data[i] = byte(rand.Uint32())
		}
		os.WriteFile(in, data, 0o600)
		if out, err := exec.CommandContext(ctx, nbdcopy, in, uri).CombinedOutput(); err != nil {
			t.Fatalf("nbdcopy in: %v\n%s", err, out)
		}
		if out, err := exec.CommandContext(ctx, nbdcopy, "--no-extents", uri, outf).CombinedOutput(); err != nil {
			t.Fatalf("nbdcopy out: %v\n%s", err, out)
		}
		back, _ := os.ReadFile(outf)
		if len(back) < len(data) || sha256.Sum256(back[:len(data)]) != sha256.Sum256(data) {
			t.Errorf("nbdcopy round trip differs (%d bytes back)", len(back))
		}
	}

	out, errs, code := runIn(t, c, runtime, "detach", l.ID, "-o", "json")
	if code != 0 {
		t.Fatalf("detach: exit %d: %s", code, errs)
	}
	var ds attachState
	if err := json.Unmarshal([]byte(out), &ds); err != nil || ds.ID != l.ID || ds.State != "detached" {
		t.Errorf("detach printed %q (%v)", out, err)
	}
	if code := awaitExit(t, done, "detach returned"); code != 0 {
		t.Errorf("attach exited %d", code)
	}
	if _, err := os.Stat(filepath.Join(runtime, "rialto", l.ID+".json")); !os.IsNotExist(err) {
		t.Errorf("state file left behind: %v", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after detach: %v", err)
	}
	if c, err := nbd.DialURI(ctx, uri); err == nil {
		c.Close()
		t.Error("attachment still serves after detach")
	}
	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 1 || !strings.Contains(errs, "not attached") {
		t.Errorf("detach twice: exit %d, %s", code, errs)
	}
}

func TestAttachUnixSocketAndErrors(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	sock := filepath.Join(t.TempDir(), "vol.sock")
	uri, done := attached(t, c, runtime, l.ID, "--socket", sock)
	if !strings.HasPrefix(uri, "nbd+unix:///") || !strings.Contains(uri, "socket=") {
		t.Fatalf("attach printed %q", uri)
	}
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("through a unix socket")
	if _, err := nc.WriteAt(msg, 4096); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	direct, err := nbd.DialURI(ctx, l.URI)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := direct.ReadAt(got, 4096); err != nil || !bytes.Equal(got, msg) {
		t.Errorf("lease does not hold what the attachment wrote: %q %v", got, err)
	}
	direct.Close()
	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 0 {
		t.Fatalf("detach: %d %s", code, errs)
	}
	<-done
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"attach"}, 2, "wrong number of arguments"},
		{[]string{"attach", "lease-nope"}, 1, "not_found"},
		{[]string{"attach", "lease-nope"}, 1, "`rialto leases` lists your live leases"},
		{[]string{"lease", "show", "lease-nope"}, 1, "`rialto leases` lists your live leases"},
		{[]string{"memtest", "lease-nope"}, 1, "`rialto leases` lists your live leases"},
		{[]string{"attach", "../x"}, 1, ""},
		{[]string{"detach", "lease-nope"}, 1, "not attached"},
		{[]string{"attach", "--conns", "-1", "lease-nope"}, 2, "bad --conns"},
		{[]string{"attach", "--timeout", "-5s", "lease-nope"}, 2, "bad --timeout"},
		{[]string{"attach", l.ID, "--listen", "127.0.0.1:0", "--socket", sock}, 2, "--listen and --socket do not go together"},
	} {
		_, errs, code := runIn(t, c, runtime, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	m, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c.Client().ReleaseLease(ctx, m.ID)
	for _, args := range [][]string{{"attach", m.ID}, {"attach", m.ID, "--fuse", t.TempDir()}} {
		// An ended lease never comes back: the error says what to do instead.
		if _, errs, code := runIn(t, c, runtime, args...); code != 1 || !strings.Contains(errs, "is released, not active") ||
			!strings.Contains(errs, "borrow another with `rialto lease create`") {
			t.Errorf("%v of a released lease: %d %s", args, code, errs)
		}
	}
}

// TestAttachProcess runs `rialto attach` as a process: detach stops it and
// waits until it has exited, and SIGTERM makes it clean up too.
func TestAttachProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	c := testcluster.Start(t, testcluster.Options{Nodes: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	procEnv := []string{"RIALTO_ADDR=" + c.URL, "RIALTO_TOKEN=" + testcluster.AdminToken, "XDG_RUNTIME_DIR=" + runtime}

	p, uri := startProc(t, bin, procEnv, "nbd+unix://", "attach", l.ID)
	uri = "nbd+unix://" + uri
	sock := filepath.Join(runtime, "rialto", l.ID+".nbd")
	if !strings.HasSuffix(uri, "?socket="+sock) {
		t.Fatalf("attach printed %q, want its socket %s", uri, sock)
	}
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.WriteAt([]byte("process"), 0); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 0 {
		t.Fatalf("detach: %d %s", code, errs)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("attach process: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("attach process still running after detach returned")
	}

	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after detach: %v", err)
	}

	// A killed attach leaves its socket (and state) behind: they do not
	// keep the next attach of the lease from serving at the same socket.
	p, _ = startProc(t, bin, procEnv, "nbd+unix://", "attach", l.ID)
	p.cmd.Process.Kill()
	<-p.done
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("a killed attach left no socket: %v %v", fi, err)
	}
	// detach of the killed attach removes what it left, its socket too.
	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 1 || !strings.Contains(errs, "removed its stale state") {
		t.Fatalf("detach of a killed attach: %d %s", code, errs)
	}
	if ents, _ := os.ReadDir(filepath.Join(runtime, "rialto")); len(ents) != 0 {
		t.Errorf("detach of a killed attach left %v behind", ents)
	}
	p, _ = startProc(t, bin, procEnv, "nbd+unix://", "attach", l.ID)
	p.cmd.Process.Kill()
	<-p.done
	p, uri2 := startProc(t, bin, procEnv, "nbd+unix://", "attach", l.ID)
	if uri2 = "nbd+unix://" + uri2; !strings.HasSuffix(uri2, "?socket="+sock) {
		t.Fatalf("attach after a killed one printed %q, want its socket %s", uri2, sock)
	}
	nc, err = nbd.DialURI(ctx, uri2)
	if err != nil {
		t.Fatalf("dial the attach that followed a killed one: %v", err)
	}
	got := make([]byte, len("process"))
	if _, err := nc.ReadAt(got, 0); err != nil || string(got) != "process" {
		t.Errorf("read through the attach that followed a killed one: %q %v", got, err)
	}
	nc.Close()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("attach after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("attach ignored SIGTERM")
	}
	if ents, _ := os.ReadDir(filepath.Join(runtime, "rialto")); len(ents) != 0 {
		t.Errorf("attach state left behind: %v", ents)
	}
}

// TestAttachEndsWithTheLease checks that attach stops by itself once its
// lease is released.
func TestAttachEndsWithTheLease(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	for _, fuse := range []bool{false, true} {
		name := "nbd"
		if fuse {
			name = "fuse"
		}
		t.Run(name, func(t *testing.T) {
			var dir string
			args := []string{"--watch", "50ms"}
			if fuse {
				if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
					t.Skip("mounting FUSE needs root and /dev/fuse here")
				}
				dir = t.TempDir()
				args = append(args, "--fuse", dir)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 4 << 20})
			if err != nil {
				t.Fatal(err)
			}
			runtime := t.TempDir()
			_, done := attached(t, c, runtime, append([]string{l.ID}, args...)...)
			if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
			if code := awaitExit(t, done, "its lease was released"); code != 1 {
				t.Errorf("attach of a released lease exited %d", code)
			}
			if _, err := os.Stat(filepath.Join(runtime, "rialto", l.ID+".json")); !os.IsNotExist(err) {
				t.Errorf("state file left behind: %v", err)
			}
			if mounts, _ := os.ReadFile("/proc/self/mounts"); fuse && strings.Contains(string(mounts), " "+dir+" ") {
				t.Errorf("%s still mounted after the lease ended", dir)
			}
		})
	}
}

// TestAttachWriteBack attaches a composed lease with --write-back: the
// state file says so, and data written through the attachment (nbdcopy,
// then a FLUSH) is on the lenders' parts, read back past the attachment.
func TestAttachWriteBack(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 32 << 20, StripeUnit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	uri, _ := attached(t, c, runtime, l.ID, "--write-back")
	b, err := os.ReadFile(filepath.Join(runtime, "rialto", l.ID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var st attachState
	if err := json.Unmarshal(b, &st); err != nil || !st.WriteBack {
		t.Fatalf("state file without write_back: %s (%v)", b, err)
	}

	// Small writes (acknowledged early) over every stripe unit, flushed,
	// then read from the parts themselves.
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	for off := 0; off < len(want); off += 8 << 10 {
		if _, err := nc.WriteAt(want[off:off+8<<10], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	for part := range l.Parts {
		pc, err := nbd.DialURI(ctx, l.Parts[part].URI)
		if err != nil {
			t.Fatal(err)
		}
		unit := make([]byte, 64<<10)
		for u := part; u*len(unit) < len(want); u += len(l.Parts) {
			if _, err := pc.ReadAt(unit, int64(u/len(l.Parts)*len(unit))); err != nil || !bytes.Equal(unit, want[u*len(unit):(u+1)*len(unit)]) {
				t.Fatalf("part %d lacks stripe unit %d after the flush: %v", part, u, err)
			}
		}
		pc.Close()
	}
}

// TestDetachReportsCloseError: when closing the attachment fails (stripe's
// Close reporting an acknowledged write lost, joined with another error),
// `rialto detach` prints every error and exits 1, and attach returns it.
func TestDetachReportsCloseError(t *testing.T) {
	runtime := t.TempDir()
	var out, errb logtest.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "XDG_RUNTIME_DIR" {
			return runtime
		}
		return ""
	}}
	ctx := context.Background()
	const id = "lease-closefails"
	file, ctlPath, ctl, err := openAttachment(ctx, e, id)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if err := recordAttachment(file, attachState{ID: id, State: "attached", PID: os.Getpid(), Control: ctlPath}); err != nil {
		t.Fatal(err)
	}
	closeErr := errors.Join(fmt.Errorf("closing: %w", stripe.ErrWriteBack), errors.New("and a second failure"))
	held := make(chan error, 1)
	go func() {
		held <- holdAttachment(ctx, nil, api.Lease{ID: id}, ctl, file, ctlPath, 0, attachHooks{close: func() error { return closeErr }})
	}()
	if code := run(ctx, []string{"detach", id}, e); code != 1 {
		t.Errorf("detach exited %d, want 1 (%s)", code, errb.String())
	}
	msg := errb.String()
	if !strings.Contains(msg, stripe.ErrWriteBack.Error()) || !strings.Contains(msg, "and a second failure") {
		t.Errorf("detach printed %q, want both of Close's errors", msg)
	}
	if err := <-held; !errors.Is(err, stripe.ErrWriteBack) {
		t.Errorf("attach returned %v, want Close's error", err)
	}
}

// TestPendingPartsNamesLender: a part whose lender has not answered
// writes or the final flush is named by its lender's node name (as the
// control plane's messages name lenders), or by its node's ID when the
// name is not known, or without a node by its lender's address, never by
// the export name in its URI (nor any credential in it); parts with none
// are left out.
func TestPendingPartsNamesLender(t *testing.T) {
	names := map[string]string{"node-a1b2": "n1", "node-c3d4": "n2"}
	for _, tc := range []struct {
		name string
		l    api.Lease
		ws   []partWait
		kind string
		want string
	}{
		{"node", api.Lease{Parts: []api.Part{{NodeID: "node-a1b2", URI: "nbds://10.0.0.1:10809/sec0"}, {NodeID: "node-c3d4", URI: "nbds://10.0.0.2:10809/sec1"}}},
			[]partWait{{writes: 1}, {writes: 2}}, "writes", "part 0 (lender n1) has 1 write unanswered; part 1 (lender n2) has 2 writes unanswered"},
		{"node name unknown", api.Lease{Parts: []api.Part{{NodeID: "node-a1b2"}, {NodeID: "node-e5f6", URI: "nbds://10.0.0.3:10809/sec1"}}},
			[]partWait{{writes: 1}, {writes: 2}}, "writes", "part 0 (lender n1) has 1 write unanswered; part 1 (lender node-e5f6) has 2 writes unanswered"},
		{"address", api.Lease{Parts: []api.Part{{URI: "nbd://10.0.0.1:10809/sec0"}, {URI: "nbd://user:pw@10.0.0.2:10810/sec1?tls=1"}}},
			[]partWait{{}, {writes: 4}}, "writes", "part 1 (lender at 10.0.0.2:10810) has 4 writes unanswered"},
		{"lease URI", api.Lease{URI: "nbd://10.0.0.3:10809/sec"}, []partWait{{writes: 1}}, "writes", "part 0 (lender at 10.0.0.3:10809) has 1 write unanswered"},
		{"final flush", api.Lease{Parts: []api.Part{{NodeID: "node-a1b2", URI: "nbds://10.0.0.1:10809/sec0"}, {NodeID: "node-c3d4", URI: "nbds://10.0.0.2:10809/sec1"}}},
			[]partWait{{}, {flush: true}}, "flush", "part 1 (lender n2) has not answered the final flush"},
		{"final flush by address", api.Lease{Parts: []api.Part{{URI: "nbd://u:pw@10.0.0.1:10809/sec0"}, {URI: "nbd://10.0.0.2:10809/sec1"}}},
			[]partWait{{flush: true}, {}}, "flush", "part 0 (lender at 10.0.0.1:10809) has not answered the final flush"},
		{"writes first", api.Lease{Parts: []api.Part{{NodeID: "node-a1b2"}, {NodeID: "node-c3d4"}}},
			[]partWait{{flush: true}, {writes: 1}}, "writes", "part 0 (lender n1) has not answered the final flush; part 1 (lender n2) has 1 write unanswered"},
		{"none", api.Lease{Parts: []api.Part{{NodeID: "node-a1b2"}}}, []partWait{{}}, "none", ""},
	} {
		got := pendingParts(tc.l, tc.ws, names)
		if got != tc.want {
			t.Errorf("%s: pendingParts = %q, want %q", tc.name, got, tc.want)
		}
		if k := pendingKind(tc.ws); k != tc.kind {
			t.Errorf("%s: pendingKind = %q, want %q", tc.name, k, tc.kind)
		}
		for _, bad := range []string{"sec", "pw", "user", "nbd"} {
			if strings.Contains(got, bad) {
				t.Errorf("%s: pendingParts = %q names %q", tc.name, got, bad)
			}
		}
	}
}

// TestAttachDamagedState: a damaged state file of a live attachment does
// not let a second attach of the lease take its sockets (orphaning it and
// serving the lease twice), and detach still stops it.
func TestAttachDamagedState(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	uri, done := attached(t, c, runtime, l.ID)
	state := filepath.Join(runtime, "rialto", l.ID+".json")
	if err := os.WriteFile(state, []byte(`{"id":"lea`), 0o600); err != nil {
		t.Fatal(err)
	}
	// Bounded: an attach that is not refused serves until its context ends.
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	var out, errb logtest.Buffer
	code := run(actx, []string{"attach", l.ID, "--listen", "127.0.0.1:0"}, clusterEnv(c, runtime, &out, &errb))
	acancel()
	if errs := errb.String(); code != 1 || !strings.Contains(errs, "already attached") {
		t.Fatalf("second attach over a damaged state file: exit %d, %s", code, errs)
	}
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatalf("the first attachment's socket after a refused second attach: %v", err)
	}
	nc.Close()
	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 0 {
		t.Fatalf("detach over a damaged state file: exit %d, %s", code, errs)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("attach still running after detach")
	}
	if ents, _ := os.ReadDir(filepath.Join(runtime, "rialto")); len(ents) != 0 {
		t.Errorf("attach state left behind: %v", ents)
	}
}

// TestAttachLostLeaseSaysWhy: attach of a block lease whose lender is
// removed (`rialto node remove --force`) while writes no flush covered
// are outstanding ends saying that the lease is lost and why (its
// reason: the lender node was removed), and what closing the
// attachment found (the unflushed writes). Before, the close's error
// replaced the lease's end: the user read "detach LEASE: stripe:
// connection to a part broke with unflushed writes" and nothing said
// the lease was lost, nor why; and the part was redialled for the whole
// redial budget (--timeout's), each attempt asking the control plane,
// which said the lease was lost, so detach waited as long.
func TestAttachLostLeaseSaysWhy(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	uri, done, errb := attachedErr(t, c, runtime, l.ID, "--watch", "50ms")
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.WriteAt(bytes.Repeat([]byte("unflushed "), 410), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().RemoveNode(ctx, c.Nodes[0].ID(), true); err != nil {
		t.Fatal(err)
	}
	if code := awaitExit(t, done, "its lender was removed"); code != 1 {
		t.Errorf("attach of a lost lease exited %d", code)
	}
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	var final string
	for i, line := range lines {
		if strings.HasPrefix(line, "rialto: error:") {
			final = strings.Join(lines[i:], "\n")
			break
		}
	}
	if want := "rialto: error: lease " + l.ID + " is lost (lender node "; !strings.HasPrefix(final, want) {
		t.Errorf("attach's last words do not begin with %q:\n%s", want, final)
	}
	for _, want := range []string{"was removed", stripe.ErrLostWrites.Error()} {
		if !strings.Contains(final, want) {
			t.Errorf("attach's last words lack %q:\n%s", want, final)
		}
	}
}

// TestAttachRedialsPartGivenUpDuringOutage: a part whose redial gave up
// while its lender and the control plane were down (not because its
// lease ended) is tried again: once both are back, reads through the
// attachment work again and find what was written before.
func TestAttachRedialsPartGivenUpDuringOutage(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// --timeout 2s: each redial gives up after 1 s.
	uri, _, errb := attachedErr(t, c, t.TempDir(), l.ID, "--watch", "50ms", "--timeout", "2s", "--conns", "1")
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	want := bytes.Repeat([]byte("before the outage "), 300)[:4096]
	if _, err := nc.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	lender := c.Nodes[0]
	c.StopControlPlane()
	lender.Kill()
	buf := make([]byte, len(want))
	testcluster.Eventually(t, 30*time.Second, "the part given up", func() bool {
		_, err := nc.ReadAt(buf, 0)
		return err != nil && strings.Contains(errb.String(), "gave up reconnecting to part")
	})
	if _, err := nc.ReadAt(buf, 0); err == nil {
		t.Fatal("a read succeeded with the lender and the control plane down")
	}
	c.StartControlPlane()
	lender.Launch()
	lender.WaitReady()
	testcluster.Eventually(t, 30*time.Second, "a read through the attachment once the lender and the control plane are back", func() bool {
		_, err := nc.ReadAt(buf, 0)
		return err == nil
	})
	if !bytes.Equal(buf, want) {
		t.Errorf("read %q after the outage, wrote %q", buf[:32], want[:32])
	}
	if got := c.Lease(l.ID).State; got != api.LeaseActive {
		t.Errorf("lease %s after the outage", got)
	}
	if n := strings.Count(errb.String(), "could not resolve part's URI"); n > 1 {
		t.Errorf("the failure to resolve the part's URI logged %d times, not once then counted:\n%s", n, errb.String())
	}
}
