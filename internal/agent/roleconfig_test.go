package agent

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestRoleConfigAPI: the control plane gets an accelerator export's role
// and config back (to load it on another lender), with the agent key
// only, and only for that lease's accelerator exports.
func TestRoleConfigAPI(t *testing.T) {
	_, srv := newFakeCP(t)
	a := start(t, testConfig(srv.URL, t.TempDir())).a
	key := bytes.Repeat([]byte{7}, 32)
	if _, err := a.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindAccel, DeviceName: "gpu",
		Offset: 0, Length: api.SlotUnits, Export: "rlc_a.0", Role: "aesgcm", RoleConfig: &api.RoleConfig{Config: key}}); err != nil {
		t.Fatal(err)
	}
	prepareBlock(t, a, "lease-b", 0, 4096)
	for _, tc := range []struct {
		name, key string
		body      api.RoleConfigRequest
		status    int
	}{
		{"no key", "", api.RoleConfigRequest{LeaseID: "lease-a", Export: "rlc_a.0"}, 401},
		{"another lease's export", "key-1", api.RoleConfigRequest{LeaseID: "lease-b", Export: "rlc_a.0"}, 404},
		{"unknown export", "key-1", api.RoleConfigRequest{LeaseID: "lease-a", Export: "nope"}, 404},
		{"a block export", "key-1", api.RoleConfigRequest{LeaseID: "lease-b", Export: "x_lease-b"}, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if resp, body := call(t, a, tc.key, "/agent/v1/role-config", tc.body); resp.StatusCode != tc.status {
				t.Errorf("%d %s, want %d", resp.StatusCode, body, tc.status)
			}
		})
	}
	resp, body := call(t, a, "key-1", "/agent/v1/role-config", api.RoleConfigRequest{LeaseID: "lease-a", Export: "rlc_a.0"})
	var rc api.RoleConfigResponse
	if resp.StatusCode != 200 || json.Unmarshal(body, &rc) != nil {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if rc.Role != "aesgcm" || rc.RoleConfig == nil || !bytes.Equal(rc.RoleConfig.Config, key) {
		t.Errorf("role config %q %v", rc.Role, rc.RoleConfig)
	}
}
