package controlplane

import (
	"context"
	"errors"
	"net/http"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// Sentinel errors of the control plane. Every error a handler returns is
// one of these (or a store sentinel) wrapped with %w; apiError maps them to
// HTTP statuses and stable API codes.
var (
	ErrInvalid      = errors.New("controlplane: invalid request")
	ErrUnauthorized = errors.New("controlplane: unauthorized")
	ErrForbidden    = errors.New("controlplane: forbidden")
	ErrNotFound     = errors.New("controlplane: not found")
	ErrConflict     = errors.New("controlplane: conflict")
	ErrInfeasible   = errors.New("controlplane: infeasible")
	ErrQuota        = errors.New("controlplane: quota exceeded")
	ErrUnavailable  = errors.New("controlplane: unavailable")
)

// apiError is the one place where errors become HTTP statuses and codes.
// Internal errors keep their detail out of the answer.
func apiError(err error) (int, api.ErrorInfo) {
	if errors.Is(err, store.ErrUnavailable) {
		return http.StatusServiceUnavailable, api.ErrorInfo{Code: api.CodeUnavailable, Message: unavailableMessage(err)}
	}
	for _, m := range []struct {
		err    error
		status int
		code   string
	}{
		{ErrInvalid, http.StatusBadRequest, api.CodeInvalid},
		{ErrUnauthorized, http.StatusUnauthorized, api.CodeUnauthorized},
		{ErrForbidden, http.StatusForbidden, api.CodeForbidden},
		{ErrNotFound, http.StatusNotFound, api.CodeNotFound},
		{store.ErrNotFound, http.StatusNotFound, api.CodeNotFound},
		{ErrConflict, http.StatusConflict, api.CodeConflict},
		{store.ErrConflict, http.StatusConflict, api.CodeConflict},
		{store.ErrDuplicate, http.StatusConflict, api.CodeConflict},
		{ErrInfeasible, http.StatusUnprocessableEntity, api.CodeInfeasible},
		{store.ErrCapacity, http.StatusUnprocessableEntity, api.CodeInfeasible},
		{ErrQuota, http.StatusTooManyRequests, api.CodeQuota},
		{ErrUnavailable, http.StatusServiceUnavailable, api.CodeUnavailable},
		{context.DeadlineExceeded, http.StatusServiceUnavailable, api.CodeUnavailable},
	} {
		if errors.Is(err, m.err) {
			return m.status, api.ErrorInfo{Code: m.code, Message: err.Error()}
		}
	}
	return http.StatusInternalServerError, api.ErrorInfo{Code: api.CodeInternal, Message: "internal error; see the control plane log"}
}
