package appliance

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/httpx"
)

// MaxRoleBody bounds a role-load request (the Wasm module travels in it).
const MaxRoleBody = 64 << 20

// Handler returns the management API:
//
//	GET    /v1/appliance               Info
//	GET    /v1/health                  Health
//	GET    /v1/slots                   []SlotStatus
//	GET    /v1/slots/{id}              SlotStatus
//	PUT    /v1/slots/{id}/role         load roles.Spec (JSON; module base64)
//	DELETE /v1/slots/{id}/role         unload
//	POST   /v1/slots/{id}/reset        zero memory, reload role
//	PUT    /v1/slots/{id}/credential   {"credential": "..."}: start a lease
//	DELETE /v1/slots/{id}/credential   end the lease
//	GET    /v1/metrics, /metrics       Prometheus text, when Config.Metrics is a prometheus.Gatherer
//	POST   /v1/slots/{id}/call/{entry} run entry on the body, answer the output
//
// The call endpoint is HTTP for convenience (curl, scripts): it takes the
// lease credential in the Rialto-Lease-Credential header instead of the
// management token. Errors are JSON {"error": {"code": CODE, "message": MSG}}.
func (a *Appliance) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/appliance", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, a.Info()) })
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, a.Health()) })
	mux.HandleFunc("GET /v1/slots", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, a.Slots()) })
	mux.HandleFunc("GET /v1/slots/{id}", a.withSlot(func(w http.ResponseWriter, r *http.Request, id int) error {
		st, err := a.Slot(id)
		if err == nil {
			writeJSON(w, http.StatusOK, st)
		}
		return err
	}))
	mux.HandleFunc("PUT /v1/slots/{id}/role", a.withSlot(func(w http.ResponseWriter, r *http.Request, id int) error {
		var spec roles.Spec
		if err := httpx.DecodeJSON(w, r, MaxRoleBody, &spec); err != nil {
			return fmt.Errorf("%w: role spec: %v", errBadRequest, err)
		}
		if err := a.Load(r.Context(), id, spec); err != nil {
			return err
		}
		st, _ := a.Slot(id)
		writeJSON(w, http.StatusOK, st)
		return nil
	}))
	mux.HandleFunc("DELETE /v1/slots/{id}/role", a.withSlot(func(w http.ResponseWriter, r *http.Request, id int) error {
		if err := a.Unload(r.Context(), id); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}))
	mux.HandleFunc("POST /v1/slots/{id}/reset", a.withSlot(func(w http.ResponseWriter, r *http.Request, id int) error {
		if err := a.Reset(r.Context(), id); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}))
	mux.HandleFunc("PUT /v1/slots/{id}/credential", a.withSlot(func(w http.ResponseWriter, r *http.Request, id int) error {
		if a.cfg.ManagedLeases {
			return errManaged
		}
		var body struct {
			Credential string `json:"credential"`
		}
		if err := httpx.DecodeJSON(w, r, 1<<16, &body); err != nil || body.Credential == "" {
			return fmt.Errorf("%w: want {\"credential\": \"...\"}", errBadRequest)
		}
		if err := a.SetCredential(id, []byte(body.Credential)); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}))
	mux.HandleFunc("DELETE /v1/slots/{id}/credential", a.withSlot(func(w http.ResponseWriter, r *http.Request, id int) error {
		if a.cfg.ManagedLeases {
			return errManaged
		}
		if err := a.SetCredential(id, nil); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}))
	if g, ok := a.cfg.Metrics.(prometheus.Gatherer); ok {
		h := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
		mux.Handle("GET /metrics", h)
		mux.Handle("GET /v1/metrics", h)
	}
	// Every other route: the documented JSON error, not the mux's text.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, http.StatusNotFound, httpx.CodeNotFound, "appliance: no route "+r.Method+" "+r.URL.Path)
	})
	call := a.withSlot(a.httpCall)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && isCallPath(r.URL.Path) {
			// Route through a tiny mux so PathValue works.
			cm := http.NewServeMux()
			cm.HandleFunc("POST /v1/slots/{id}/call/{entry}", call)
			cm.ServeHTTP(w, r)
			return
		}
		if a.cfg.ManagementToken == "" {
			mux.ServeHTTP(w, r)
			return
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(a.cfg.ManagementToken)) != 1 {
			writeError(w, errUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// isCallPath reports whether p is /v1/slots/{id}/call/{entry}.
func isCallPath(p string) bool {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	return len(parts) == 5 && parts[0] == "v1" && parts[1] == "slots" && parts[3] == "call"
}

// MaxCallBody bounds the input of an HTTP call.
const MaxCallBody = 16 << 20

func (a *Appliance) httpCall(w http.ResponseWriter, r *http.Request, id int) error {
	s, err := a.slot(id)
	if err != nil {
		return err
	}
	t := (*slotTarget)(s)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	exit, ok := s.currentLease().enter(cancel)
	if !ok {
		return fmt.Errorf("%w: lease ended", accel.ErrAuth)
	}
	defer exit()
	if err := t.Authenticate([]byte(r.Header.Get("Rialto-Lease-Credential"))); err != nil {
		return err
	}
	in, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxCallBody))
	if err != nil {
		return fmt.Errorf("%w: body above %d bytes", accel.ErrTooLarge, MaxCallBody)
	}
	outs, err := t.Execute(ctx, r.PathValue("entry"), [][]byte{in})
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(outs[0])
	return nil
}

var (
	errBadRequest   = errors.New("appliance: bad request")
	errUnauthorized = errors.New("appliance: management token required")
	errManaged      = errors.New("appliance: lease credentials are managed by the control plane; create or release a lease instead")
)

func (a *Appliance) withSlot(h func(http.ResponseWriter, *http.Request, int) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		if err != nil {
			writeError(w, fmt.Errorf("%w: slot id %q", ErrNoSlot, r.PathValue("id")))
			return
		}
		if err := h(w, r, id); err != nil {
			writeError(w, err)
		}
	}
}

// httpErrors maps errors to HTTP statuses and stable API codes: the one
// place where that happens.
var httpErrors = httpx.ErrorMap{
	{Err: ErrNoSlot, Status: http.StatusNotFound, Code: "no_such_slot"},
	{Err: errUnauthorized, Status: http.StatusUnauthorized, Code: "unauthorized"},
	{Err: errBadRequest, Status: http.StatusBadRequest, Code: "bad_request"},
	{Err: errManaged, Status: http.StatusConflict, Code: "managed_leases"},
	{Err: roles.ErrUnknownRole, Status: http.StatusBadRequest, Code: "unknown_role"},
	{Err: roles.ErrBadModule, Status: http.StatusBadRequest, Code: "bad_module"},
	{Err: roles.ErrBadConfig, Status: http.StatusBadRequest, Code: "bad_role_config"},
	{Err: accel.ErrAuth, Status: http.StatusForbidden, Code: "lease_credential_rejected"},
	{Err: accel.ErrNoRole, Status: http.StatusConflict, Code: "no_role"},
	{Err: roles.ErrUnknownEntry, Status: http.StatusNotFound, Code: "unknown_entry"},
	{Err: roles.ErrBadInput, Status: http.StatusBadRequest, Code: "bad_input"},
	{Err: accel.ErrTooLarge, Status: http.StatusRequestEntityTooLarge, Code: "too_large"},
	{Err: accel.ErrRoleFailed, Status: http.StatusInternalServerError, Code: "role_failed"},
	{Err: roles.ErrWasmTrap, Status: http.StatusInternalServerError, Code: "role_failed"},
}

func writeError(w http.ResponseWriter, err error) {
	httpErrors.Write(w, err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	httpx.WriteJSON(w, status, v)
}
