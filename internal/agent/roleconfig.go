package agent

import (
	"fmt"
	"net/http"

	"github.com/rialto-project/rialto/api"
)

// RoleConfig returns the role (and its config, a secret) an accelerator
// export of lease leaseID serves, for the control plane to load it into a
// slot on another lender (POST /agent/v1/role-config, agent key).
func (a *Agent) RoleConfig(req api.RoleConfigRequest) (api.RoleConfigResponse, error) {
	a.mu.Lock()
	e, ok := a.exports[req.Export]
	a.mu.Unlock()
	if !ok || e.Request.LeaseID != req.LeaseID || req.LeaseID == "" {
		return api.RoleConfigResponse{}, fmt.Errorf("%w: no such export", ErrNoDevice)
	}
	if e.Device.Kind != api.KindAccel {
		return api.RoleConfigResponse{}, fmt.Errorf("%w: the export is not an accelerator's", ErrBadRequest)
	}
	return api.RoleConfigResponse{Role: e.Request.Role, RoleConfig: e.Request.RoleConfig, Gateway: e.Request.Gateway}, nil
}

func (a *Agent) roleConfigRoute(mux *http.ServeMux) {
	mux.HandleFunc("POST /agent/v1/role-config", a.auth(func(w http.ResponseWriter, r *http.Request) {
		var req api.RoleConfigRequest
		if !decodeBody(w, r, &req) {
			return
		}
		resp, err := a.RoleConfig(req)
		a.answer(w, r, http.StatusOK, resp, err)
	}))
}
