package redfish

import (
	"errors"
	"net/http"

	"github.com/rialto-project/rialto/api"
)

// registry is the Base message registry version messages are named from.
const registry = "Base.1.18."

// rfError is an error answered in Redfish's format: an error object with
// a Base registry message in @Message.ExtendedInfo.
type rfError struct {
	status int
	id     string // Base message ID, e.g. "ResourceNotFound"
	msg    string
	res    string // resolution
}

func (e *rfError) Error() string { return e.msg }

func errNotFound(path string) error {
	return &rfError{status: http.StatusNotFound, id: "ResourceNotFound", msg: "no resource at " + path, res: "Check the URI; collections list their members."}
}

func errNoSession(msg string) error {
	return &rfError{status: http.StatusUnauthorized, id: "NoValidSession", msg: msg, res: "Log in at /redfish/v1/SessionService/Sessions with a Rialto API token as the password, or use Basic auth."}
}

func errBadRequest(id, msg string) error {
	return &rfError{status: http.StatusBadRequest, id: id, msg: msg, res: "Correct the request body and resubmit (docs/redfish.md)."}
}

// toRedfish maps an error, most often an *api.Error from the control
// plane, to a Redfish error. The control plane's message (placement's
// reason, for one) is kept.
func toRedfish(err error) *rfError {
	var rf *rfError
	if errors.As(err, &rf) {
		return rf
	}
	var ae *api.Error
	if !errors.As(err, &ae) {
		return &rfError{status: http.StatusInternalServerError, id: "InternalError", msg: "internal error; see the control plane log"}
	}
	e := &rfError{status: ae.Status, msg: ae.Message}
	switch ae.Code {
	case api.CodeInvalid:
		e.id, e.res = "GeneralError", "Correct the request and resubmit."
	case api.CodeUnauthorized:
		e.id, e.res = "NoValidSession", "Use a valid Rialto API token (Basic auth password, session or bearer)."
	case api.CodeForbidden:
		e.id, e.res = "InsufficientPrivilege", "Use a tenant token; node credentials and the bootstrap token cannot do this."
	case api.CodeNotFound:
		e.id, e.res = "ResourceNotFound", "Check the URI."
	case api.CodeConflict:
		e.id, e.res = "ResourceInUse", "Read the resource again and retry."
	case api.CodeInfeasible:
		e.id, e.res = "ResourceExhaustion", "Ask for less, or free resource blocks; the message gives placement's reason."
	case api.CodeQuota:
		e.id, e.res = "ResourceExhaustion", "The tenant's quota is reached; decompose a system first."
	case api.CodeUnavailable:
		e.id, e.res = "ServiceTemporarilyUnavailable", "Retry later."
	default:
		e.id = "InternalError"
	}
	return e
}

// writeError answers err in Redfish's format.
func writeError(w http.ResponseWriter, err error) {
	e := toRedfish(err)
	if e.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="rialto"`)
	}
	sev := "Critical"
	if e.status < 500 {
		sev = "Warning"
	}
	info := obj{
		"@odata.type":     typeOf("Message"),
		"MessageId":       registry + e.id,
		"Message":         e.msg,
		"Severity":        sev,
		"MessageSeverity": sev,
	}
	if e.res != "" {
		info["Resolution"] = e.res
	}
	body := obj{"error": obj{
		"code":                  registry + e.id,
		"message":               e.msg,
		"@Message.ExtendedInfo": []obj{info},
	}}
	writeJSON(w, nil, e.status, body, "")
}
