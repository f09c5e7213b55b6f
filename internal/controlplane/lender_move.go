package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/rialto-project/rialto/api"
)

// transferLender is how the control plane drives a move on the lenders:
// the agents' transfer API (/agent/v1/transfers, docs/api.md "Agent API")
// and, for an accelerator slot placed again elsewhere, the role it serves.
// HTTPLender implements it; a Config.Lender that does not is used for
// prepares and teardowns only, and moves go to the agents over HTTP.
type transferLender interface {
	TransferIn(ctx context.Context, node api.Node, agentKey string, req api.TransferInRequest) (api.TransferInResponse, error)
	TransferOut(ctx context.Context, node api.Node, agentKey string, req api.TransferOutRequest) (api.Transfer, error)
	// TransferStatus returns the transfer's state; with while set, once it
	// is no longer in that state (or after the agent's wait of a second).
	TransferStatus(ctx context.Context, node api.Node, agentKey, id, while string) (api.Transfer, error)
	TransferSeal(ctx context.Context, node api.Node, agentKey, id string) (api.Transfer, error)
	TransferCommit(ctx context.Context, node api.Node, agentKey, id string, req api.TransferCommitRequest) (api.TransferCommitResponse, error)
	TransferAbort(ctx context.Context, node api.Node, agentKey, id string) (api.Transfer, error)
	RoleConfig(ctx context.Context, node api.Node, agentKey string, req api.RoleConfigRequest) (api.RoleConfigResponse, error)
}

var _ transferLender = (*HTTPLender)(nil)

// TransferIn asks the destination to receive a part.
func (h *HTTPLender) TransferIn(ctx context.Context, node api.Node, agentKey string, req api.TransferInRequest) (api.TransferInResponse, error) {
	var out api.TransferInResponse
	err := h.post(ctx, node, agentKey, "/agent/v1/transfers/in", req, &out)
	return out, err
}

// TransferOut asks the source to copy a part to the destination.
func (h *HTTPLender) TransferOut(ctx context.Context, node api.Node, agentKey string, req api.TransferOutRequest) (api.Transfer, error) {
	var out api.Transfer
	err := h.post(ctx, node, agentKey, "/agent/v1/transfers/out", req, &out)
	return out, err
}

// TransferSeal seals a ready transfer on its source.
func (h *HTTPLender) TransferSeal(ctx context.Context, node api.Node, agentKey, id string) (api.Transfer, error) {
	var out api.Transfer
	err := h.post(ctx, node, agentKey, "/agent/v1/transfers/"+url.PathEscape(id)+"/seal", struct{}{}, &out)
	return out, err
}

// TransferCommit commits a transfer on one side (req: the lease's expiry,
// for the destination).
func (h *HTTPLender) TransferCommit(ctx context.Context, node api.Node, agentKey, id string, req api.TransferCommitRequest) (api.TransferCommitResponse, error) {
	var out api.TransferCommitResponse
	err := h.post(ctx, node, agentKey, "/agent/v1/transfers/"+url.PathEscape(id)+"/commit", req, &out)
	return out, err
}

// TransferAbort gives a transfer up on one side.
func (h *HTTPLender) TransferAbort(ctx context.Context, node api.Node, agentKey, id string) (api.Transfer, error) {
	var out api.Transfer
	err := h.post(ctx, node, agentKey, "/agent/v1/transfers/"+url.PathEscape(id)+"/abort", struct{}{}, &out)
	return out, err
}

// RoleConfig asks a lender for an accelerator export's role and config.
func (h *HTTPLender) RoleConfig(ctx context.Context, node api.Node, agentKey string, req api.RoleConfigRequest) (api.RoleConfigResponse, error) {
	var out api.RoleConfigResponse
	err := h.post(ctx, node, agentKey, "/agent/v1/role-config", req, &out)
	return out, err
}

// TransferStatus reads a transfer's state, waiting while it is in while.
func (h *HTTPLender) TransferStatus(ctx context.Context, node api.Node, agentKey, id, while string) (api.Transfer, error) {
	var out api.Transfer
	if node.AgentURL == "" {
		return out, fmt.Errorf("controlplane: node %s has no agent URL", node.ID)
	}
	u := strings.TrimRight(node.AgentURL, "/") + "/agent/v1/transfers/" + url.PathEscape(id)
	if while != "" {
		u += "?while=" + url.QueryEscape(while)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return out, fmt.Errorf("controlplane: agent %s: %w", node.ID, err)
	}
	req.Header.Set("Authorization", "Bearer "+agentKey)
	hc := h.hc
	if h.client != nil {
		if hc, err = h.client(node); err != nil {
			return out, err
		}
	}
	path := "/agent/v1/transfers/" + url.PathEscape(id)
	resp, err := hc.Do(req)
	if err != nil {
		return out, &lenderError{node: node, path: path, err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return out, &lenderError{node: node, path: path, err: err}
	}
	if resp.StatusCode/100 != 2 {
		return out, answerError(node, path, resp.Status, data)
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return out, &lenderError{node: node, path: path, err: fmt.Errorf("decode: %w", err)}
	}
	return out, nil
}
