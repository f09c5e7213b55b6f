package controlplane

import (
	"errors"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

func TestValidateAccelRequest(t *testing.T) {
	t.Parallel()
	key := &api.RoleConfig{Config: []byte("0123456789abcdef")}
	for _, tc := range []struct {
		name string
		req  api.LeaseRequest
		want string // "" = valid
	}{
		{"dedicated slot", api.LeaseRequest{Kind: api.KindAccel, Role: "sha256"}, ""},
		{"no role", api.LeaseRequest{Kind: api.KindAccel}, ""},
		{"shared with role and key", api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "aesgcm", RoleConfig: key}, ""},
		{"shared without role", api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared}, "give a role"},
		{"shared count 2", api.LeaseRequest{Kind: api.KindAccel, Mode: api.ModeShared, Role: "echo", Count: 2}, "count 1"},
		{"config without role", api.LeaseRequest{Kind: api.KindAccel, RoleConfig: key}, "needs a role"},
		{"config too big", api.LeaseRequest{Kind: api.KindAccel, Role: "wasm",
			RoleConfig: &api.RoleConfig{Config: make([]byte, api.MaxRoleConfig/2), Module: make([]byte, api.MaxRoleConfig/2+1)}}, "more than"},
		{"role on block", api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Role: "echo"}, "accel leases only"},
		{"config on memory", api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20, RoleConfig: key}, "accel leases only"},
		// A share sizes a shared accel lease only; elsewhere it was ignored.
		{"share on block", api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20, Share: 0.5}, "share applies to shared accel leases only"},
		{"share on shared memory", api.LeaseRequest{Kind: api.KindMemory, Mode: api.ModeShared, Size: 1 << 20, Share: 0.5}, "share applies"},
		{"share on nic", api.LeaseRequest{Kind: api.KindNIC, Bandwidth: 1e6, Share: 0.5}, "not to a nic lease"},
	} {
		err := validateAccelRequest(&tc.req)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "0123456789abcdef"):
			t.Errorf("%s: the error quotes the key", tc.name)
		}
	}
}
