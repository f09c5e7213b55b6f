package httpx

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// logSignal is a slog handler that sends each record's level and message.
type logSignal struct {
	slog.Handler
	msgs chan string
}

func (h logSignal) Handle(_ context.Context, r slog.Record) error {
	h.msgs <- r.Level.String() + " " + r.Message
	return nil
}

// stopServer is a real server over TLS whose ConnState is conns.Track,
// HTTP/2 unless http1.
func stopServer(t *testing.T, h http.Handler, http1 bool) (*httptest.Server, *Conns, *http.Client) {
	t.Helper()
	conns := &Conns{}
	ts := httptest.NewUnstartedServer(h)
	ts.EnableHTTP2 = !http1
	ts.Config.ConnState = conns.Track // httptest calls it from its own
	ts.StartTLS()
	t.Cleanup(ts.Close)
	hc := ts.Client()
	t.Cleanup(hc.CloseIdleConnections)
	return ts, conns, hc
}

func get(hc *http.Client, url string) (*http.Response, string, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

// TestStopIdleHTTP2: a server whose client keeps an idle HTTP/2
// connection stops at once; http.Server.Shutdown waited a second for the
// client to hang up after its GOAWAY.
func TestStopIdleHTTP2(t *testing.T) {
	t.Parallel()
	ts, conns, hc := stopServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), false)
	resp, _, err := get(hc, ts.URL)
	if err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("%v %v: this test needs an HTTP/2 connection", resp, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	conns.Stop(ctx, ts.Config, slog.New(slog.DiscardHandler), "test API")
	if took, bound := time.Since(start), 300*time.Millisecond; took > bound {
		t.Errorf("Stop took %v (bound %v)", took, bound)
	}
	if n, _ := conns.Busy(); n != 0 {
		t.Errorf("%d connections busy after Stop", n)
	}
}

// TestStopAnswersRequestsInFlight: stopping takes no new connection but
// lets a request under way finish and get its whole answer, over HTTP/1
// and over HTTP/2, where a connection turns idle before its answer is
// flushed (closing it then, as the agent API's stop used to, cut the answer
// off in most of these runs), and returns then.
func TestStopAnswersRequestsInFlight(t *testing.T) {
	t.Parallel()
	for _, http1 := range []bool{true, false} {
		name := map[bool]string{true: "HTTP/1", false: "HTTP/2"}[http1]
		t.Run(strings.ReplaceAll(name, "/", ""), func(t *testing.T) {
			t.Parallel()
			for range 20 {
				stopInFlight(t, http1)
			}
		})
	}
}

func stopInFlight(t *testing.T, http1 bool) {
	entered, release := make(chan struct{}), make(chan struct{})
	answer := strings.Repeat("the answer ", 1000)
	ts, conns, hc := stopServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, answer)
	}), http1)
	type result struct {
		resp *http.Response
		body string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, body, err := get(hc, ts.URL)
		got <- result{resp, body, err}
	}()
	<-entered
	msgs := make(chan string, 16)
	log := slog.New(logSignal{slog.NewTextHandler(io.Discard, nil), msgs})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		conns.Stop(ctx, ts.Config, log, "test API")
	}()
	if m := <-msgs; m != "INFO test API: waiting for the requests under way" {
		t.Fatalf("logged %q", m)
	}
	if c, err := net.Dial("tcp", ts.Listener.Addr().String()); err == nil {
		c.Close()
		t.Error("the stopping server took a new connection")
	}
	close(release)
	r := <-got
	if r.err != nil || r.body != answer || r.resp.ProtoMajor != map[bool]int{true: 1, false: 2}[http1] {
		t.Fatalf("the request under way got %d bytes, %v (%v)", len(r.body), r.err, r.resp)
	}
	<-stopped
}

// TestStopBound: a request that does not end in time has its connection
// closed when Stop's context ends, with a warning.
func TestStopBound(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	ts, conns, hc := stopServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done() // the connection's close ends it
	}), false)
	got := make(chan error, 1)
	go func() {
		_, _, err := get(hc, ts.URL)
		got <- err
	}()
	<-entered
	msgs := make(chan string, 16)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	conns.Stop(ctx, ts.Config, slog.New(logSignal{slog.NewTextHandler(io.Discard, nil), msgs}), "test API")
	if err := <-got; err == nil {
		t.Error("the request cut off by Stop got an answer")
	}
	close(msgs)
	var all []string
	for m := range msgs {
		all = append(all, m)
	}
	if len(all) != 2 || !strings.HasPrefix(all[1], "WARN test API: requests still under way; closing their connections") {
		t.Errorf("logged %q", all)
	}
}
