package agent_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/testcluster"
)

// stopBound is how long an idle agent may take to stop once its context is
// cancelled. It used to take over a second (2.6 s seen): the agent API's
// graceful shutdown waited for clients holding idle HTTP/2 connections to
// hang up, which they need not do.
const stopBound = 400 * time.Millisecond

// TestIdleAgentStopsPromptly: an idle agent of a real cluster (a control
// plane with its CA, the agent enrolled, as `rialto server` and `rialto
// agent` run) stops within stopBound of its context's cancel, although a
// client holds an idle HTTP/2 connection to its API (as the control plane
// and the peers' round-trip probes do), and logs at info that it is
// stopping and that it stopped.
func TestIdleAgentStopsPromptly(t *testing.T) {
	logs := &syncBuffer{}
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, TLS: true,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	n := c.Nodes[0]

	ca, err := os.ReadFile(c.CA.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(n.Agent().AgentURL() + "/agent/v1/ping")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("the agent API answered over %s: this test needs an HTTP/2 connection", resp.Proto)
	}

	start := time.Now()
	n.Kill() // cancels the agent's context and waits for Run to return
	if took := time.Since(start); took > stopBound {
		t.Errorf("the agent took %v to stop (bound %v)", took, stopBound)
	} else {
		t.Logf("the agent stopped in %v", took)
	}
	out := logs.String()
	for _, want := range []string{`level=INFO msg="agent stopping"`, `level=INFO msg="agent stopped"`} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %s:\n%s", want, out)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
