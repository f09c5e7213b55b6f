package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
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
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(g.Stats())
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
var httpErrors = []struct {
	err    error
	status int
	code   string
}{
	{accel.ErrAuth, http.StatusForbidden, "credential_rejected"},
	{ErrQueueFull, http.StatusTooManyRequests, "queue_full"},
	{ErrQueueTimeout, http.StatusServiceUnavailable, "queue_timeout"},
	{ErrStopped, http.StatusServiceUnavailable, "stopped"},
	{accel.ErrTooLarge, http.StatusRequestEntityTooLarge, "too_large"},
	{roles.ErrUnknownEntry, http.StatusNotFound, "unknown_entry"},
	{roles.ErrBadInput, http.StatusBadRequest, "bad_input"},
	{accel.ErrNoRole, http.StatusConflict, "no_role"},
}

func httpError(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	for _, he := range httpErrors {
		if errors.Is(err, he.err) {
			status, code = he.status, he.code
			break
		}
	}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Code, body.Error.Message = code, err.Error()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
