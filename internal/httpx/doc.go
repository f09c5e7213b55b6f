// Package httpx is the HTTP plumbing Rialto's servers share: JSON answers
// (WriteJSON), the error body {"error": {"code": ..., "message": ...}} with
// its stable codes (WriteError, ErrorMap: errors mapped to statuses and
// codes in one table per server), strict JSON request bodies with a size
// limit (DecodeJSON; DecodeJSONTolerant ignores unknown fields, for
// requests from peers that may be newer), and reading an error body back
// (ReadError). The control plane, the agent, the accelerator appliance
// and the gateway answer through it; the Redfish facade keeps Redfish's
// own error format. Conns stops a server promptly: it waits for the
// requests under way, not for clients to close their idle connections
// (`rialto server` and the agent stop their APIs with it).
//
// It imports nothing from Rialto, so the data planes (internal/dataplane/...)
// answer in the API's error shape without importing api; api.ErrorBody has
// the same JSON shape and api's Code constants the same values, which a test
// keeps so.
//
// Conns aside, there is no state: the zero ErrorMap maps every error to
// 500 "internal", and every function is safe for concurrent use.
package httpx
