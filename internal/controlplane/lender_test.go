package controlplane

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestHTTPLender drives the default lender against an agent-side HTTP
// double: bearer agent key, prepare with the export name, teardown, and a
// lender that never answers being skipped after PrepareTimeout.
func TestHTTPLender(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := map[string][]string{} // path → lease IDs
	keys := map[string]string{}  // agent name → expected key
	release := make(chan struct{})
	agent := func(name string, hang bool) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			want := keys[name]
			mu.Unlock()
			if r.Header.Get("Authorization") != "Bearer "+want || want == "" {
				w.WriteHeader(http.StatusUnauthorized)
				json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorInfo{Code: api.CodeUnauthorized, Message: "bad agent key"}})
				return
			}
			if hang && r.URL.Path == "/agent/v1/prepare" {
				select {
				case <-r.Context().Done():
				case <-release:
				}
				return
			}
			var id string
			switch r.URL.Path {
			case "/agent/v1/prepare":
				var req api.PrepareRequest
				if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
					http.Error(w, err.Error(), 400)
					return
				}
				id = req.LeaseID
				json.NewEncoder(w).Encode(api.PrepareResponse{URI: "nbd://127.0.0.1:10809/" + req.Export})
			case "/agent/v1/teardown":
				var req api.TeardownRequest
				json.NewDecoder(r.Body).Decode(&req)
				id = req.LeaseID
				w.Write([]byte("{}"))
			default:
				http.NotFound(w, r)
				return
			}
			mu.Lock()
			got[name+r.URL.Path] = append(got[name+r.URL.Path], id)
			mu.Unlock()
		}))
	}
	good, slow := agent("good", false), agent("slow", true)
	defer good.Close()
	defer slow.Close()
	defer close(release)

	// The good agent must answer within the timeout also on a loaded
	// machine (300 ms failed there); the slow one costs it once at most.
	e := newEnv(t, func(c *Config) { c.Lender = nil; c.PrepareTimeout = 2 * time.Second })
	join := func(name, url string) api.JoinResponse {
		jr, err := e.boot.Join(e.ctx(), api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: url,
			Fingerprint: api.Fingerprint{MachineID: "mid-" + name},
			Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30}}})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		keys[name] = jr.AgentKey
		mu.Unlock()
		return jr
	}
	join("slow", slow.URL)
	jg := join("good", good.URL)
	// Whichever node placement tries first, the lease ends on the good
	// one: the slow agent never confirms and is skipped after the timeout.
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}
	l, err := e.alice.CreateLease(e.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	if l.NodeID != jg.NodeID || l.State != api.LeaseActive || !strings.HasPrefix(l.URI, "nbd://") || !(strings.HasSuffix(l.URI, "/"+partExport(l.Credential, 0, 1)) || strings.HasSuffix(l.URI, "/"+partExport(l.Credential, 0, 2))) {
		t.Fatalf("lease %+v", l)
	}
	if _, err := e.alice.ReleaseLease(e.ctx(), l.ID); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	ok := len(got["good/agent/v1/prepare"]) == 1 && len(got["good/agent/v1/teardown"]) == 1 && got["good/agent/v1/teardown"][0] == l.ID
	mu.Unlock()
	if !ok {
		t.Fatalf("agent calls %v", got)
	}
	// A lender that never answers: Prepare gives up with the context.
	mu.Lock()
	slowKey := keys["slow"]
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err = NewHTTPLender(nil).Prepare(ctx, api.Node{ID: "slow", AgentURL: slow.URL}, slowKey, api.PrepareRequest{LeaseID: "l"})
	cancel()
	if err == nil || ctx.Err() == nil {
		t.Fatalf("hung prepare: %v", err)
	}
	// A wrong agent key is refused by the agent: the lender reports it.
	err = NewHTTPLender(nil).Teardown(context.Background(), api.Node{ID: "x", AgentURL: good.URL}, "wrong", api.TeardownRequest{LeaseID: l.ID})
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong key: %v", err)
	}
}
