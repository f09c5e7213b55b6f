package accel

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/rialto-project/rialto/api"
)

// HTTPError maps one error to an HTTP status and a stable code.
type HTTPError struct {
	Err    error
	Status int
	Code   string
}

// LookupHTTPError returns the first entry of table that err matches
// (errors.Is), or 500 "internal".
func LookupHTTPError(table []HTTPError, err error) HTTPError {
	for _, he := range table {
		if errors.Is(err, he.Err) {
			return he
		}
	}
	return HTTPError{Err: err, Status: http.StatusInternalServerError, Code: "internal"}
}

// WriteHTTPError answers err as {"error": {"code", "message"}} (the same
// body as the control plane's API), mapped through table.
func WriteHTTPError(w http.ResponseWriter, table []HTTPError, err error) {
	he := LookupHTTPError(table, err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(he.Status)
	_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorInfo{Code: he.Code, Message: err.Error()}})
}
