package agent

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
)

// TestMetricsCarryLeaseIDsNotCredentials pins the rule of
// docs/operations.md ("Access"): an agent's /metrics answers without a
// token, and of what it serves only the per-lease series of a gateway
// (rialto_gateway_lease_*) name a lease, by its ID, which is no
// credential (the API checks whose a lease is); no series carries a
// lease's data-plane credential (its export name) or the agent key.
func TestMetricsCarryLeaseIDsNotCredentials(t *testing.T) {
	_, srv := newFakeCP(t)
	r := start(t, testConfig(srv.URL, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leases := map[string]string{"lease-mx1": "rlc_mx1secret.0", "lease-mx2": "rlc_mx2secret.0"}
	slot := int64(0)
	for id, export := range leases {
		resp, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: id, Kind: api.KindAccel, Mode: api.ModeShared, DeviceName: "gpu",
			Offset: slot * api.SlotUnits, Length: api.SlotUnits, Export: export, Role: "sha256", Gateway: true})
		if err != nil {
			t.Fatal(err)
		}
		slot++
		u, cred := accelURI(t, resp.URI)
		c, err := accel.Dial(ctx, u.Host, []byte(cred))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Call(ctx, "sum", []byte("abc")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	resp, err := http.Get(r.a.AgentURL() + "/metrics") // no token
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics without a token: %s", resp.Status)
	}
	seen := map[string]bool{}
	for line := range strings.Lines(body.String()) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		for id := range leases {
			if strings.Contains(line, id) {
				seen[id] = true
				if !strings.HasPrefix(line, "rialto_gateway_lease_") || !strings.Contains(line, `lease="`+id+`"`) {
					t.Errorf("a series other than a gateway's per-lease one names lease %s: %s", id, line)
				}
			}
		}
	}
	for id, export := range leases {
		if !seen[id] {
			t.Errorf("no per-lease series of lease %s (the rule this test pins is moot: update docs/operations.md)", id)
		}
		for _, secret := range []string{export, strings.TrimSuffix(export, ".0")} {
			if strings.Contains(body.String(), secret) {
				t.Errorf("/metrics carries lease %s's credential %q", id, secret)
			}
		}
	}
	r.a.mu.Lock()
	key := r.a.id.AgentKey
	r.a.mu.Unlock()
	if key != "" && strings.Contains(body.String(), key) {
		t.Error("/metrics carries the agent key")
	}
}
