package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// serverStopBound is how long `rialto server` may take to stop once its
// context is cancelled (SIGINT, SIGTERM) with nothing under way. It used to
// take over a second while a client kept an idle HTTP/2 connection, as
// every agent does: http.Server.Shutdown waited for the clients to hang up
// after its GOAWAY, which they need not do, until the server gave up on
// them a second later.
const serverStopBound = 400 * time.Millisecond

// lineLog is an io.Writer that keeps the lines written to it, for a test
// to wait for one.
type lineLog struct {
	mu      sync.Mutex
	lines   []string
	partial string
	changed chan struct{} // closed and replaced at each line
}

func newLineLog() *lineLog { return &lineLog{changed: make(chan struct{})} }

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.partial + string(p)
	for {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, s[:i])
		s = s[i+1:]
		close(l.changed)
		l.changed = make(chan struct{})
	}
	l.partial = s
	return len(p), nil
}

// wait returns the first line that contains sub, waiting for it until ctx
// ends (then it fails t).
func (l *lineLog) wait(ctx context.Context, t *testing.T, sub string) string {
	t.Helper()
	for {
		l.mu.Lock()
		for _, line := range l.lines {
			if strings.Contains(line, sub) {
				l.mu.Unlock()
				return line
			}
		}
		ch := l.changed
		all := strings.Join(l.lines, "\n")
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("no line with %q:\n%s", sub, all)
		}
	}
}

// inProcessServer is `rialto server` over HTTPS run in the test's process.
type inProcessServer struct {
	url            string
	ca             *x509.CertPool
	dir            string // its state: cp.db, tls/
	stdout, stderr *lineLog
	cancel         context.CancelFunc
	exited         chan struct{} // closed when run has returned
	code           int           // run's exit code, once exited
}

// wait waits for run to return and returns its exit code.
func (s *inProcessServer) wait() int {
	<-s.exited
	return s.code
}

const stopTestAdmin = "stop-test-admin-token"

func startInProcessServer(t *testing.T) *inProcessServer {
	t.Helper()
	return startInProcessServerIn(t, t.TempDir())
}

// startInProcessServerIn starts `rialto server` on the state in dir.
func startInProcessServerIn(t *testing.T, dir string) *inProcessServer {
	t.Helper()
	s := &inProcessServer{dir: dir, stdout: newLineLog(), stderr: newLineLog(), exited: make(chan struct{})}
	vars := map[string]string{"RIALTO_BOOTSTRAP_TOKEN": "stop-test-boot", "RIALTO_ADMIN_TOKEN": stopTestAdmin}
	e := &env{stdout: s.stdout, stderr: s.stderr, getenv: func(k string) string { return vars[k] }}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.exited)
		s.code = run(ctx, []string{"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "cp.db"),
			"--tls-dir", filepath.Join(dir, "tls"), "--log-level", "info"}, e)
	}()
	t.Cleanup(func() {
		cancel()
		s.wait()
	})
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	s.url = strings.TrimPrefix(s.stdout.wait(wctx, t, "rialto server: serving "), "rialto server: serving ")
	pem, err := os.ReadFile(filepath.Join(dir, "tls", pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	s.ca = x509.NewCertPool()
	s.ca.AppendCertsFromPEM(pem)
	return s
}

// client returns an HTTP/2 client of the server with a transport of its
// own (connections of their own); it keeps its idle connections until the
// test ends.
func (s *inProcessServer) client(t *testing.T) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.ca}, ForceAttemptHTTP2: true, ExpectContinueTimeout: time.Minute}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// idleConnection leaves an idle HTTP/2 connection to the server, as an
// agent between two heartbeats does.
func (s *inProcessServer) idleConnection(t *testing.T) {
	t.Helper()
	resp, err := s.client(t).Get(s.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("the API answered over %s: this test needs an HTTP/2 connection", resp.Proto)
	}
}

// TestServerStopsPromptly: `rialto server` stops within serverStopBound of
// its context's cancel although a client keeps an idle HTTP/2 connection
// to it, and says so.
func TestServerStopsPromptly(t *testing.T) {
	t.Parallel()
	s := startInProcessServer(t)
	s.idleConnection(t)
	start := time.Now()
	s.cancel()
	code := s.wait()
	took := time.Since(start)
	if code != 0 {
		t.Errorf("rialto server exited %d", code)
	}
	if took > serverStopBound {
		t.Errorf("rialto server took %v to stop (bound %v)", took, serverStopBound)
	} else {
		t.Logf("rialto server stopped in %v", took)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s.stderr.wait(ctx, t, `msg="control plane stopped"`)
}

// TestServerStopAnswersRequestsInFlight: a request the control plane is
// serving as it is told to stop gets its answer, over HTTP/2 beside an
// idle connection of another client; the server then stops at once, not a
// second later.
func TestServerStopAnswersRequestsInFlight(t *testing.T) {
	t.Parallel()
	s := startInProcessServer(t)
	s.idleConnection(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// A lease creation whose body the handler is waiting for: it asks
	// for it (100 Continue) once it reads it, and the body comes once the
	// server stops.
	body, send := io.Pipe()
	reading := make(chan struct{})
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got100Continue: func() { close(reading) }}),
		http.MethodPost, s.url+"/v1/leases", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+stopTestAdmin)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	type answer struct {
		resp *http.Response
		body []byte
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := s.client(t).Do(req)
		if err != nil {
			got <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- answer{resp, b, err}
	}()
	select {
	case <-reading:
	case a := <-got:
		t.Fatalf("the request ended before its body was read: %+v", a)
	}
	s.cancel()
	s.stderr.wait(ctx, t, "waiting for the requests under way")
	start := time.Now()
	io.WriteString(send, `{"kind":"block","size":1048576}`)
	send.Close()
	a := <-got
	if a.err != nil {
		t.Fatalf("the request in flight as the server stopped: %v", a.err)
	}
	var eb api.ErrorBody
	if a.resp.ProtoMajor != 2 || a.resp.StatusCode != http.StatusUnprocessableEntity || json.Unmarshal(a.body, &eb) != nil || eb.Error.Code != api.CodeInfeasible {
		t.Fatalf("the request in flight as the server stopped got %s %d %s", a.resp.Proto, a.resp.StatusCode, a.body)
	}
	code := s.wait()
	took := time.Since(start)
	if code != 0 {
		t.Errorf("rialto server exited %d", code)
	}
	if took > serverStopBound {
		t.Errorf("rialto server took %v to stop once the request had its body (bound %v)", took, serverStopBound)
	} else {
		t.Logf("rialto server stopped %v after the request had its body", took)
	}
}

// TestSecondServerOnOneSQLiteRefused: two `rialto server`s on one SQLite
// file each kept their own view of the leases and lent the same ranges to
// two tenants. The second is refused, naming the first; once the first
// has stopped, the file is free again.
func TestSecondServerOnOneSQLiteRefused(t *testing.T) {
	first := startInProcessServer(t)
	second := func(ctx context.Context) (int, string) {
		var out, errb bytes.Buffer
		vars := map[string]string{"RIALTO_BOOTSTRAP_TOKEN": "stop-test-boot", "RIALTO_ADMIN_TOKEN": stopTestAdmin}
		code := run(ctx, []string{"server", "--listen", "127.0.0.1:0", "--db", filepath.Join(first.dir, "cp.db"),
			"--tls-dir", filepath.Join(first.dir, "tls")}, &env{stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }})
		return code, errb.String()
	}
	// Bounded: a second server that is not refused serves until then.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	code, errs := second(ctx)
	want := fmt.Sprintf("is served by another rialto server (pid %d, this process)", os.Getpid())
	if code == 0 || !strings.Contains(errs, want) {
		t.Fatalf("a second server on the file: exit %d, %q; want it refused with %q", code, errs, want)
	}
	first.cancel()
	if c := first.wait(); c != 0 {
		t.Fatalf("the first server exited %d", c)
	}
	// Free now: the next one serves.
	next := startInProcessServerIn(t, first.dir)
	next.cancel()
	if c := next.wait(); c != 0 {
		t.Errorf("a server on the file after the first stopped: exit %d", c)
	}
}
