package controlplane

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/ui"
)

// uiService builds the dashboard (package ui) over the /v1 routes of api.
func (s *Server) uiService(api http.Handler) *ui.UI {
	u, err := ui.New(ui.Config{API: api, Logger: s.log.With("component", "ui"), Now: func() time.Time { return s.clock.Now() }})
	if err != nil {
		panic("controlplane: ui: " + err.Error()) // embedded templates; a test covers them
	}
	return u
}

// hLoginLink mints a one-time dashboard login link for the caller's token.
func (s *Server) hLoginLink(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	_, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return 0, nil, fmt.Errorf("%w: no token", ErrUnauthorized)
	}
	code, exp := s.ui.NewLoginCode(tok)
	s.log.Info("dashboard login link issued", "tenant", p.tenant, "who", p.fp)
	return http.StatusCreated, api.LoginLink{Path: "/ui/login?code=" + url.QueryEscape(code), ExpiresAt: exp.UTC()}, nil
}

// hWhoami tells who the caller's token is.
func (s *Server) hWhoami(ctx context.Context, p principal, r *http.Request, w http.ResponseWriter) (int, any, error) {
	switch p.role {
	case roleTenant:
		return http.StatusOK, api.Whoami{Role: "tenant", Tenant: p.tenant, Admin: p.admin}, nil
	case roleNode:
		return http.StatusOK, api.Whoami{Role: "node", NodeID: p.nodeID}, nil
	}
	return 0, nil, fmt.Errorf("%w: not a tenant token or node credential", ErrForbidden)
}
