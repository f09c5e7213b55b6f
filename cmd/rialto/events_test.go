package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
	"github.com/rialto-project/rialto/internal/logtest"
)

// `rialto events --follow -o json` streams the log from a control plane:
// one JSON event per line, the old ones and then each new one, until
// interrupted (exit 0).
func TestEventsFollow(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := controlplane.New(t.Context(), controlplane.Config{Store: st, Tokens: []controlplane.Token{{Token: "tok", Tenant: "ops", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	defer srv.CloseStreams()
	old, _ := st.AppendEvent(context.Background(), api.Event{Type: "test.old", Subject: "x"})
	var out, errb logtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		return map[string]string{"RIALTO_ADDR": ts.URL, "RIALTO_TOKEN": "tok"}[k]
	}}
	go func() { code <- run(ctx, []string{"events", "--follow", "-o", "json"}, e) }()
	want := []int64{old.ID}
	for i := range 3 {
		ev, _ := st.AppendEvent(context.Background(), api.Event{Type: "test.new", Subject: "x", Message: string(rune('a' + i))})
		want = append(want, ev.ID)
	}
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for strings.Count(out.String(), "\n") < len(want) {
		select {
		case <-deadline.C:
			t.Fatalf("events --follow printed:\n%s\nstderr: %s", out.String(), errb.String())
		case <-tick.C:
		}
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit %d: %s", c, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, l := range lines {
		var ev api.Event
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.ID != want[i] {
			t.Fatalf("line %d %q: %v (want ID %d)", i, l, err, want[i])
		}
	}
}
