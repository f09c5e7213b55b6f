package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/logtest"
)

// stuckLenderRig is `rialto server` and two `rialto agent` processes (a1,
// a2), each lending one block device, and a composed lease of two parts,
// one on each, attached in process with `rialto attach`.
type stuckLenderRig struct {
	id      string
	lease   api.Lease
	e       *env
	errb    *logtest.Buffer
	agents  map[string]*proc  // by node ID
	names   map[string]string // node names by node ID
	runtime string
}

func startStuckLenderRig(t *testing.T) *stuckLenderRig {
	t.Helper()
	bin := buildBinary(t)
	dir := t.TempDir()
	secrets := []string{"RIALTO_BOOTSTRAP_TOKEN=boot-secret", "RIALTO_ADMIN_TOKEN=admin-secret"}
	// A stopped lender stays in the cluster (not down) for the test's span.
	_, url := startProc(t, bin, secrets, "rialto server: serving ",
		"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"), "--tls-dir", filepath.Join(dir, "tls"),
		"--heartbeat", "200ms", "--suspect-after", "5m", "--down-after", "10m", "--log-level", "warn")
	caFile := filepath.Join(dir, "tls", "ca-cert.pem")
	penv := append(secrets, "RIALTO_ADDR="+url, "RIALTO_CACERT="+caFile)
	byName := map[string]*proc{}
	for _, name := range []string{"a1", "a2"} {
		p, _ := startProc(t, bin, penv, "", "agent", "--name", name, "--state-dir", filepath.Join(dir, name),
			"--block", "disk0="+filepath.Join(dir, name+".img")+":64MiB", "--insecure-dataplane", "--log-level", "warn")
		byName[name] = p
		t.Cleanup(func() { p.cmd.Process.Signal(syscall.SIGCONT) }) // so that it can be stopped
	}
	hc, err := api.HTTPClient(caFile, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(url, "admin-secret", hc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	agents := map[string]*proc{}
	names := map[string]string{}
	poll(t, "both agents ready", 60*time.Second, func() bool {
		ns, err := cl.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, n := range ns {
			if n.State == api.NodeReady {
				ready++
				agents[n.ID] = byName[n.Name]
				names[n.ID] = n.Name
			}
		}
		return ready == 2
	})
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 32 << 20, StripeUnit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Parts) != 2 || l.Parts[0].NodeID == l.Parts[1].NodeID || agents[l.Parts[1].NodeID] == nil {
		t.Fatalf("composed lease's parts are not one on each agent: %+v", l.Parts)
	}
	r := &stuckLenderRig{id: l.ID, lease: l, agents: agents, names: names, runtime: t.TempDir(), errb: &logtest.Buffer{}}
	r.e = &env{stdout: &logtest.Buffer{}, stderr: r.errb, getenv: func(k string) string {
		switch k {
		case "RIALTO_ADDR":
			return url
		case "RIALTO_TOKEN":
			return "admin-secret"
		case "RIALTO_CACERT":
			return caFile
		case "XDG_RUNTIME_DIR":
			return r.runtime
		}
		return ""
	}}
	return r
}

// attach runs `rialto attach` of the lease in process (no lease watch;
// requests bounded by a minute, past the test's stops) and returns the
// URI it serves and a channel with its exit code.
func (r *stuckLenderRig) attach(t *testing.T) (string, <-chan int) {
	t.Helper()
	out := &logtest.Buffer{}
	e := *r.e
	e.stdout = out
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		done <- run(ctx, []string{"attach", r.id, "--watch", "0", "--timeout", "1m", "--conns", "1"}, &e)
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	var uri string
	poll(t, "attach prints its URI", 60*time.Second, func() bool {
		select {
		case code := <-done:
			t.Fatalf("attach exited %d: %s", code, r.errb.String())
		default:
		}
		line, _, ok := strings.Cut(out.String(), "\n")
		uri = line
		return ok
	})
	return uri, done
}

// detach runs `rialto detach` of the lease with a deadline and returns its
// exit code and what it printed on stderr.
func (r *stuckLenderRig) detach(timeout string) (int, string) {
	var out, errb logtest.Buffer
	e := *r.e
	e.stdout, e.stderr = &out, &errb
	code := run(context.Background(), []string{"detach", r.id, "--timeout", timeout}, &e)
	return code, errb.String()
}

// pending is what the attach process says its close waits for (askPending).
func (r *stuckLenderRig) pending() (string, string) {
	return askPending(context.Background(), filepath.Join(r.runtime, "rialto", r.id+".ctl"))
}

// signal stops or continues part i's lender's agent process.
func (r *stuckLenderRig) signal(t *testing.T, i int, sig syscall.Signal) {
	t.Helper()
	p := r.agents[r.lease.Parts[i].NodeID].cmd.Process
	if err := p.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if sig != syscall.SIGSTOP {
		return
	}
	// kill(2) returns before the process has stopped: until every
	// thread has, the lender may still answer what the test sends next.
	poll(t, "the lender's threads to stop", 30*time.Second, func() bool {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", p.Pid))
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				return false
			}
			i := strings.LastIndexByte(string(b), ')')
			if i < 0 || i+2 >= len(b) || b[i+2] != 'T' && b[i+2] != 't' {
				return false
			}
		}
		return true
	})
}

// checkStuckMessage checks detach's message: it names part 1 and its
// lender (want), says what is safe and what to do, and names no URI,
// export or other part.
func (r *stuckLenderRig) checkStuckMessage(t *testing.T, msg string, want ...string) {
	t.Helper()
	t.Logf("detach printed: %s", msg)
	pid := strconv.Itoa(os.Getpid())
	want = append(want, "detach "+r.id+": the attachment (process "+pid+") has not ended after 300ms",
		"`rialto lease show "+r.id+"` shows its parts", "`rialto detach --timeout 10m "+r.id+"`", "`kill "+pid+"`")
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("detach printed %q, want %q", msg, w)
		}
	}
	bad := []string{"nbd://", "part 0", "i/o timeout", "no answer"}
	for _, p := range r.lease.Parts {
		bad = append(bad, p.URI[strings.LastIndexByte(p.URI, '/')+1:], p.NodeID) // its node by name
	}
	for _, b := range bad {
		if strings.Contains(msg, b) {
			t.Errorf("detach printed %q, which names %q", msg, b)
		}
	}
}

// onPart1 checks that part 1's lender holds want at off of its part.
func (r *stuckLenderRig) onPart1(ctx context.Context, t *testing.T, off int64, want []byte) {
	t.Helper()
	p1, err := nbd.DialURI(ctx, r.lease.Parts[1].URI)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	got := make([]byte, len(want))
	if _, err := p1.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("part 1's lender lacks the write at %d of its part", off)
	}
}

// TestDetachNamesStuckLender drives `rialto detach` of a real attachment
// of a composed lease whose part 1's lender (an agent process) is stopped
// with SIGSTOP. A write it has not answered: detach, past its deadline,
// exits 1 naming part 1 and its lender and the write, with what is safe
// and what to do. Every write answered, the close's final flush it has
// not answered: detach names part 1 and its lender and the flush (it gave
// the generic "waiting for a lender to answer a write"); a second detach
// while the first waits (the message's own advice) waits too, where it
// read "no answer from process N: EOF". Continued, the lender answers and
// the attachment ends cleanly, every write on the lenders.
func TestDetachNamesStuckLender(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	r := startStuckLenderRig(t)
	// By its node's name (a2, say), as the control plane names lenders,
	// not its ID.
	lender := "part 1 (lender " + r.names[r.lease.Parts[1].NodeID] + ")"
	const unit = 64 << 10
	data := bytes.Repeat([]byte("acknowledged "), unit/13+1)[:unit]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("write", func(t *testing.T) {
		uri, done := r.attach(t)
		nc, err := nbd.DialURI(ctx, uri)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		r.signal(t, 1, syscall.SIGSTOP)
		written := make(chan error, 1)
		go func() {
			_, err := nc.WriteAt(data, unit) // part 1's first stripe unit
			written <- err
		}()
		poll(t, "the write to wait for part 1's lender", 30*time.Second, func() bool {
			kind, parts := r.pending()
			return kind == "writes" && parts == lender+" has 1 write unanswered"
		})
		code, msg := r.detach("300ms")
		if code != 1 {
			t.Errorf("detach exited %d, want 1: %s", code, msg)
		}
		r.checkStuckMessage(t, msg, "still waiting for a lender to answer a write", lender+" has 1 write unanswered",
			"Writes it acknowledged are on the lenders", "to give up the writes not yet on the lenders")
		r.signal(t, 1, syscall.SIGCONT)
		// Its client is gone with the attachment's export (the write was
		// not acknowledged); the lender has it.
		<-written
		if code := awaitExit(t, done, "the lender continued"); code != 0 {
			t.Errorf("attach exited %d: %s", code, r.errb.String())
		}
		r.onPart1(ctx, t, 0, data)
	})

	t.Run("final flush", func(t *testing.T) {
		uri, done := r.attach(t)
		nc, err := nbd.DialURI(ctx, uri)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.WriteAt(data, 3*unit); err != nil { // part 1's second unit, acknowledged, not flushed
			t.Fatal(err)
		}
		nc.Close()
		r.signal(t, 1, syscall.SIGSTOP)
		first := make(chan int, 1)
		go func() {
			code, _ := r.detach("2m")
			first <- code
		}()
		poll(t, "the final flush to wait for part 1's lender", 30*time.Second, func() bool {
			kind, parts := r.pending()
			return kind == "flush" && parts == lender+" has not answered the final flush"
		})
		code, msg := r.detach("300ms")
		if code != 1 {
			t.Errorf("detach exited %d, want 1: %s", code, msg)
		}
		r.checkStuckMessage(t, msg, "every write was answered, and it is still waiting for a lender to answer the final flush",
			lender+" has not answered the final flush", "The writes are on the lenders", "not confirmed durable")
		if strings.Contains(msg, "unanswered") {
			t.Errorf("detach printed %q: no write is unanswered", msg)
		}
		r.signal(t, 1, syscall.SIGCONT)
		if code := <-first; code != 0 {
			t.Errorf("the first detach exited %d once the lender answered", code)
		}
		if code := awaitExit(t, done, "the lender continued"); code != 0 {
			t.Errorf("attach exited %d: %s", code, r.errb.String())
		}
		r.onPart1(ctx, t, unit, data)
	})
}
