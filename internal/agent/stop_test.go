package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
)

// logSignal is a slog handler that sends each record's message.
type logSignal struct {
	slog.Handler
	msgs chan string
}

func (h logSignal) Handle(_ context.Context, r slog.Record) error {
	h.msgs <- r.Message
	return nil
}

// TestStopAPIWaitsForRequests: stopping the agent API takes no new
// connection but lets a request under way finish and answer, and then
// returns (with the server's Serve).
func TestStopAPIWaitsForRequests(t *testing.T) {
	msgs := make(chan string, 16)
	a := &Agent{log: slog.New(logSignal{slog.NewTextHandler(io.Discard, nil), msgs})}
	entered, release := make(chan struct{}), make(chan struct{})
	var conns apiConns
	srv := &http.Server{ConnState: conns.track, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, "done")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	go func() {
		defer close(serving)
		srv.Serve(ln)
	}()
	type answer struct {
		body string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/slow")
		if err != nil {
			got <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- answer{string(b), err}
	}()
	<-entered
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		a.stopAPI(srv, &conns, serving)
	}()
	for m := range msgs {
		if strings.HasPrefix(m, "agent API: waiting for the requests under way") {
			break
		}
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Error("the stopping API took a new connection")
	}
	close(release)
	if ans := <-got; ans.err != nil || ans.body != "done" {
		t.Errorf("the request under way got %q, %v", ans.body, ans.err)
	}
	<-stopped
}
