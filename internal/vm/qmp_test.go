package vm

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd/nbdtest"
)

func TestParseQMP(t *testing.T) {
	for _, tc := range []struct {
		line string
		kind string // greeting, return, error, event, or "" for malformed
	}{
		{`{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": ["oob"]}}`, "greeting"},
		{`{"return": {}, "id": 1}`, "return"},
		{`{"return": {"status": "running", "running": true}, "id": 7}`, "return"},
		{`{"id": 2, "error": {"class": "GenericError", "desc": "Requested export not available"}}`, "error"},
		{`{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "STOP"}`, "event"},
		{`{"event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}`, "event"},
		{`{"return": {}}`, ""},                       // a reply without an id
		{`{"return": {}, "error": {}, "id": 1}`, ""}, // both
		{`{}`, ""},
		{`[1]`, ""},
		{`{"return": {}, "id": 1} {"x": 1}`, ""},
		{`{"id": "one", "return": {}}`, ""},
		{`not json`, ""},
	} {
		m, err := parseQMP([]byte(tc.line))
		kind := ""
		switch {
		case err != nil:
		case m.Greeting != nil:
			kind = "greeting"
		case m.Return != nil:
			kind = "return"
		case m.Error != nil:
			kind = "error"
		case m.Event != "":
			kind = "event"
		}
		if kind != tc.kind {
			t.Errorf("%s: %q (%v), want %q", tc.line, kind, err, tc.kind)
		}
		if err != nil && !errors.Is(err, ErrQMP) {
			t.Errorf("%s: %v is not ErrQMP", tc.line, err)
		}
	}
}

func TestRedactor(t *testing.T) {
	r := redactor("s3cret", "", "other")
	if got := r("export 's3cret' on other host; s3cret again"); got != "export 'xxxxx' on xxxxx host; xxxxx again" {
		t.Errorf("redacted: %q", got)
	}
	if got := redactor("")("nothing to hide"); got != "nothing to hide" {
		t.Errorf("no secrets: %q", got)
	}
}

func FuzzParseQMP(f *testing.F) {
	f.Add([]byte(`{"return": {}, "id": 1}`))
	f.Add([]byte(`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}`))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "x"}, "id": 3}`))
	f.Add([]byte(`{"QMP": {"capabilities": []}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseQMP(b)
		if err != nil {
			return
		}
		if (m.Return != nil || m.Error != nil) && m.ID == nil {
			t.Fatal("a reply without an id passed")
		}
	})
}

func needQEMU(t *testing.T) string {
	t.Helper()
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	return q
}

// A real qemu's QMP: the greeting and capabilities, a command, an error —
// whose message, quoting the NBD export qemu could not open, comes back
// redacted — and the end of the conversation when qemu quits.
func TestQMPWithQEMU(t *testing.T) {
	qemu := needQEMU(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "qmp.sock")
	cmd := exec.Command(qemu, "-machine", "none", "-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-qmp", "unix:"+sock+",server=on,wait=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-waited
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// An NBD lender that has no export of that name.
	srv := &nbd.Server{}
	ln := nbdtest.Listen(t)
	nbdtest.Serve(t, srv, ln)
	const secret = "rlc_qmp_secret_export"

	var q *QMP
	var err error
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if q, err = DialQMP(ctx, sock, redactor(secret)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QMP: %v", err)
		}
		<-tick.C
	}
	defer q.Close()
	st, err := q.Execute(ctx, "query-status", nil)
	if err != nil || !strings.Contains(string(st), `"prelaunch"`) {
		t.Fatalf("query-status: %s %v", st, err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	_, err = q.Execute(ctx, "blockdev-add", map[string]any{"driver": "nbd", "node-name": "d0",
		"server": map[string]any{"type": "inet", "host": host, "port": port}, "export": secret})
	if !errors.Is(err, ErrQMP) || strings.Contains(err.Error(), secret) {
		t.Fatalf("blockdev-add of a missing export: %v", err)
	}
	if _, err := q.Execute(ctx, "no-such-command", nil); err == nil || !strings.Contains(err.Error(), "CommandNotFound") {
		t.Fatalf("unknown command: %v", err)
	}
	if _, err := q.Execute(ctx, "quit", nil); err != nil {
		select {
		case <-q.Done():
		default:
			t.Fatal(err)
		}
	}
	select {
	case <-q.Done():
	case <-ctx.Done():
		t.Fatal("the conversation did not end when qemu quit")
	}
	if _, err := q.Execute(ctx, "query-status", nil); !errors.Is(err, ErrQMP) {
		t.Fatalf("a command after qemu quit: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("qemu: %v", err)
	}
	waited <- nil
	_ = os.Remove(sock)
}
