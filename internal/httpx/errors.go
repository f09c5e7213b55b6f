package httpx

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// ErrorBody is every error answer: {"error": {"code": ..., "message": ...}}
// (the shape of api.ErrorBody).
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo is a stable machine code and a message for people.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// The stable codes every Rialto API uses (the values of api's Code
// constants). A server may add codes of its own for errors these do not
// name.
const (
	CodeInvalid      = "invalid_request" // 400
	CodeUnauthorized = "unauthorized"    // 401: missing or unknown token
	CodeForbidden    = "forbidden"       // 403: token not allowed to do this
	CodeNotFound     = "not_found"       // 404
	CodeConflict     = "conflict"        // 409: wrong state, idempotency mismatch
	CodeInfeasible   = "infeasible"      // 422: no placement satisfies the request
	CodeQuota        = "quota_exceeded"  // 429
	CodeUnavailable  = "unavailable"     // 503
	CodeInternal     = "internal"        // 500
)

// WriteError answers with status and the error body of code and message.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	WriteJSON(w, status, ErrorBody{Error: ErrorInfo{Code: code, Message: message}})
}

// Mapping maps the errors matching Err (errors.Is) to an HTTP status and a
// stable code.
type Mapping struct {
	Err    error
	Status int
	Code   string
}

// ErrorMap is a server's table of Mappings: the one place where its errors
// become statuses and codes. The first match wins.
type ErrorMap []Mapping

// Lookup returns the first mapping err matches, or 500 CodeInternal.
func (m ErrorMap) Lookup(err error) Mapping {
	for _, e := range m {
		if errors.Is(err, e.Err) {
			return e
		}
	}
	return Mapping{Err: err, Status: http.StatusInternalServerError, Code: CodeInternal}
}

// Write answers err with its mapping's status and code and err's message.
func (m ErrorMap) Write(w http.ResponseWriter, err error) {
	e := m.Lookup(err)
	WriteError(w, e.Status, e.Code, err.Error())
}

// Sentinel returns the error of the first mapping with code, or nil: what
// a client's error type unwraps to, so that errors.Is matches an answer's
// code against the server's sentinel.
func (m ErrorMap) Sentinel(code string) error {
	for _, e := range m {
		if e.Code == code {
			return e.Err
		}
	}
	return nil
}

// maxErrorBody bounds what ReadError reads of an answer.
const maxErrorBody = 64 << 10

// ReadError reads an error answer's body (at most 64 KiB of it). A body
// that is not the error shape gives an empty ErrorInfo.
func ReadError(body io.Reader) ErrorInfo {
	var e ErrorBody
	_ = json.NewDecoder(io.LimitReader(body, maxErrorBody)).Decode(&e)
	return e.Error
}
