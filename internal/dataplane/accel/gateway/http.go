package gateway

import (
	"fmt"
	"io"
	"net/http"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/httpx"
)

// MaxCallBody bounds the input of an HTTP call.
const MaxCallBody = 16 << 20

// Handler serves the gateway over HTTP, for convenience:
//
//	GET  /v1/stats          Stats as JSON
//	POST /v1/call/{entry}   run entry on the body (one item), answer the output
//
// Calls present a credential in the Rialto-Lease-Credential header, checked
// by auth. Errors are JSON {"error": {"code": CODE, "message": MSG}}.
func (g *Gateway) Handler(auth func(credential []byte) error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, g.Stats())
	})
	mux.HandleFunc("POST /v1/call/{entry}", func(w http.ResponseWriter, r *http.Request) {
		if err := auth([]byte(r.Header.Get("Rialto-Lease-Credential"))); err != nil {
			httpError(w, fmt.Errorf("%w: gateway %s", accel.ErrAuth, g.cfg.Name))
			return
		}
		in, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxCallBody))
		if err != nil {
			httpError(w, fmt.Errorf("%w: body above %d bytes", accel.ErrTooLarge, MaxCallBody))
			return
		}
		out, err := g.Call(r.Context(), r.PathValue("entry"), in)
		if err != nil {
			httpError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(out)
	})
	return mux
}

// httpErrors maps errors to statuses and stable codes, in one place.
var httpErrors = httpx.ErrorMap{
	{Err: accel.ErrAuth, Status: http.StatusForbidden, Code: "credential_rejected"},
	{Err: ErrQueueFull, Status: http.StatusTooManyRequests, Code: "queue_full"},
	{Err: ErrLeaseQueueFull, Status: http.StatusTooManyRequests, Code: "lease_queue_full"},
	{Err: accel.ErrInputBudget, Status: http.StatusTooManyRequests, Code: "input_budget"},
	{Err: ErrQueueTimeout, Status: http.StatusServiceUnavailable, Code: "queue_timeout"},
	{Err: ErrStopped, Status: http.StatusServiceUnavailable, Code: "stopped"},
	{Err: accel.ErrTooLarge, Status: http.StatusRequestEntityTooLarge, Code: "too_large"},
	{Err: roles.ErrUnknownEntry, Status: http.StatusNotFound, Code: "unknown_entry"},
	{Err: roles.ErrBadInput, Status: http.StatusBadRequest, Code: "bad_input"},
	{Err: accel.ErrNoRole, Status: http.StatusConflict, Code: "no_role"},
}

func httpError(w http.ResponseWriter, err error) {
	httpErrors.Write(w, err)
}
