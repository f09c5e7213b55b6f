package controlplane

import (
	"context"
	"fmt"
	"net/http"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/httpapi"
)

// moveRoutes are the routes of moves, cordons and drains (move.go,
// drain.go).
func (s *Server) moveRoutes() []route {
	nodeErrors := []int{400, 401, 403, 404, 409, 500, 503}
	return []route{
		{httpapi.Route{Method: "POST", Path: "/v1/leases/{id}/move", Summary: "Move a block or memory lease's parts to other lenders while it is used; answers the moves started (GET /v1/moves to follow them).",
			Request: api.MoveRequest{}, Response: []api.Move{}, Status: http.StatusAccepted, Errors: []int{400, 401, 403, 404, 409, 422, 500, 503}}, accessTenant, s.hMoveLease},
		{httpapi.Route{Method: "GET", Path: "/v1/moves", Summary: "Lease moves under way and of the last hour (of one lease: all of them) that the caller may see.",
			Response: []api.Move{}, Query: []httpapi.Param{{Name: "lease", Type: "string", Description: "only the moves of this lease"}}, Errors: []int{400, 401, 403, 404, 500, 503}}, accessTenant, s.hMoves},
		{httpapi.Route{Method: "GET", Path: "/v1/moves/{id}", Summary: "Show a move.", Response: api.Move{}, Errors: []int{401, 403, 404, 500, 503}}, accessTenant, s.hMove},
		{httpapi.Route{Method: "POST", Path: "/v1/nodes/{id}/cordon", Summary: "Place no new part on a node (by ID or name); its leases stay. Admin.",
			Response: api.Node{}, Errors: nodeErrors}, accessTenant, s.hCordon(true)},
		{httpapi.Route{Method: "POST", Path: "/v1/nodes/{id}/uncordon", Summary: "Let placement use a cordoned node again. Admin.",
			Response: api.Node{}, Errors: nodeErrors}, accessTenant, s.hCordon(false)},
		{httpapi.Route{Method: "POST", Path: "/v1/nodes/{id}/drain", Summary: "Cordon a node and move every lease off it before a deadline; what cannot move is left in place and reported. Admin.",
			Request: api.DrainRequest{}, Response: api.Drain{}, Status: http.StatusAccepted, Errors: nodeErrors}, accessTenant, s.hDrain},
		{httpapi.Route{Method: "GET", Path: "/v1/nodes/{id}/drain", Summary: "A node's latest drain since the control plane started. Admin.",
			Response: api.Drain{}, Errors: []int{401, 403, 404, 500}}, accessTenant, s.hGetDrain},
	}
}

func requireAdmin(p principal, what string) error {
	if !p.admin {
		return fmt.Errorf("%w: %s needs an admin token", ErrForbidden, what)
	}
	return nil
}

func (s *Server) hMoveLease(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	var req api.MoveRequest
	if err := decode(w, r, true, &req); err != nil {
		return 0, nil, err
	}
	out, err := s.moveLease(ctx, p, r.PathValue("id"), req)
	return http.StatusAccepted, out, err
}

func (s *Server) hMoves(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	out, err := s.listMoves(ctx, p, r.URL.Query().Get("lease"))
	return http.StatusOK, out, err
}

func (s *Server) hMove(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	out, err := s.getMove(ctx, p, r.PathValue("id"))
	return http.StatusOK, out, err
}

func (s *Server) hCordon(cordon bool) handlerFunc {
	return func(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
		if err := requireAdmin(p, "cordoning a node"); err != nil {
			return 0, nil, err
		}
		var empty struct{}
		if err := decode(w, r, true, &empty); err != nil {
			return 0, nil, err
		}
		out, err := s.cordonNode(ctx, r.PathValue("id"), cordon)
		return http.StatusOK, out, err
	}
}

func (s *Server) hDrain(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	if err := requireAdmin(p, "draining a node"); err != nil {
		return 0, nil, err
	}
	var req api.DrainRequest
	if err := decode(w, r, true, &req); err != nil {
		return 0, nil, err
	}
	out, err := s.drainNode(ctx, r.PathValue("id"), req)
	return http.StatusAccepted, out, err
}

func (s *Server) hGetDrain(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	if err := requireAdmin(p, "a node's drain"); err != nil {
		return 0, nil, err
	}
	out, err := s.nodeDrain(ctx, r.PathValue("id"))
	return http.StatusOK, out, err
}
