package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// TestLeasesLiveByDefault: `rialto leases` asks the server for live leases
// only; --all (or -a) asks for the whole history.
func TestLeasesLiveByDefault(t *testing.T) {
	now := time.Now()
	live := api.Lease{ID: "lease-live", State: api.LeaseActive, Kind: api.KindBlock, CreatedAt: now}
	ended := api.Lease{ID: "lease-ended", State: api.LeaseReleased, Kind: api.KindBlock, CreatedAt: now.Add(-time.Minute)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/nodes":
			json.NewEncoder(w).Encode([]api.Node{})
		case r.URL.Path == "/v1/leases" && r.URL.Query().Get("live") == "1":
			json.NewEncoder(w).Encode([]api.Lease{live})
		case r.URL.Path == "/v1/leases" && r.URL.RawQuery == "":
			json.NewEncoder(w).Encode([]api.Lease{ended, live})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args       []string
		want, lack []string
	}{
		{[]string{"leases"}, []string{"lease-live"}, []string{"lease-ended"}},
		{[]string{"leases", "-o", "json"}, []string{"lease-live"}, []string{"lease-ended"}},
		{[]string{"leases", "--all"}, []string{"lease-live", "lease-ended", "released"}, nil},
		{[]string{"leases", "-a", "-o", "json"}, []string{"lease-live", "lease-ended"}, nil},
	} {
		out, errs, code := runCLI(t, srv.URL, tc.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out)
			}
		}
		for _, l := range tc.lack {
			if strings.Contains(out, l) {
				t.Errorf("%v: output has %q:\n%s", tc.args, l, out)
			}
		}
	}
}
