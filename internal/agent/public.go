package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"syscall"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/httpx"
)

// Refusal is an error of the agent API's with two texts: Err, the whole
// story for this agent's log (lease IDs, internal steps, the lender's
// host paths), and Public, what the agent's error answer says — the words
// the control plane quotes to the tenant whose lease the call was for,
// which name the device and what is wrong with it and nothing of the
// lender's filesystem.
type Refusal struct {
	Public string
	Err    error
}

func (r *Refusal) Error() string { return r.Err.Error() }
func (r *Refusal) Unwrap() error { return r.Err }

// refuse is err (whose text, the log's, is logged) with the public words
// public.
func refuse(public string, err error) error {
	return &Refusal{Public: public, Err: err}
}

// publicMessage is the one place an error of the agent API becomes its
// answer's message. A Refusal says its Public words. An error of the
// agent's sentinels says its text without the package's prefix: those
// texts are written for the caller (they name the device, the range or the
// request, never another lease, a path or a step). Anything else — a
// failure of this agent's own, whose text may hold host paths — reads as
// a failure on the lender's side whose details are in the agent's log.
func publicMessage(err error) string {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Public
	}
	for _, s := range publicSentinels {
		if errors.Is(err, s) {
			return strings.ReplaceAll(err.Error(), "agent: ", "")
		}
	}
	return "it failed on its side (its agent's log says why)"
}

// publicSentinels are the agent's errors whose texts an answer may quote
// (publicMessage).
var publicSentinels = []error{ErrBadRequest, ErrNoDevice, ErrNoDriver, ErrOutOfRange, ErrRefused, ErrConflict, ErrOverlap,
	ErrGaveUp, ErrNoTransfer, ErrTransferState, ErrCannotMove, ErrNotJoined, ErrUnauthorized}

// deviceRefusal is err, a failure of device dev (of its driver, its
// backing file or this agent's record of the export) while it prepared or
// received a part of lease req.LeaseID, as a Refusal: logged, it reads
// "agent: STEP LEASE on DEV: …"; answered, it says what is wrong with the
// device (publicDeviceWords).
func deviceRefusal(step string, req api.PrepareRequest, dev string, err error) error {
	return refuse(publicDeviceWords(req, dev, err), fmt.Errorf("agent: %s %s on %s: %w", step, req.LeaseID, dev, err))
}

// publicDeviceWords says what err, a failure of device dev for req, is in
// words a tenant reads: the common failures by their cause, an agent's
// sentinel by its text (publicMessage) and anything else as the device
// not being prepared, with the system's word for the cause when there is
// one.
func publicDeviceWords(req api.PrepareRequest, dev string, err error) string {
	var errno syscall.Errno
	hasErrno := errors.As(err, &errno)
	switch {
	case errors.Is(err, roles.ErrUnknownRole):
		return fmt.Sprintf("device %s cannot load role %q (no such role)", dev, req.Role)
	case errors.Is(err, roles.ErrBadConfig), errors.Is(err, roles.ErrBadModule):
		return fmt.Sprintf("device %s cannot load role %q: %s", dev, req.Role, lastClause(err))
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("device %s cannot be opened (no such file or directory)", dev)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("device %s cannot be opened (permission denied)", dev)
	case errors.Is(err, syscall.EBUSY), errors.Is(err, ErrInUse):
		return fmt.Sprintf("device %s is busy (another program holds it)", dev)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Sprintf("device %s is out of space", dev)
	case errors.Is(err, syscall.EROFS):
		return fmt.Sprintf("device %s is read-only", dev)
	case errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.ENODEV):
		return fmt.Sprintf("device %s is not present (no such device)", dev)
	case errors.Is(err, syscall.EIO):
		return fmt.Sprintf("device %s failed to read or write (input/output error)", dev)
	}
	for _, s := range publicSentinels {
		if errors.Is(err, s) {
			return publicMessage(err)
		}
	}
	if hasErrno {
		return fmt.Sprintf("device %s could not be prepared (%v)", dev, errno)
	}
	return fmt.Sprintf("device %s could not be prepared (the lender's agent log says why)", dev)
}

// lastClause is the last ": "-separated clause of err's text: what a
// sentinel-wrapped error adds to its sentinel ("bad module: empty module"
// → "empty module").
func lastClause(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// answerError answers err with errorMap's status and code and its public
// words (publicMessage); when those leave something out, the whole error
// goes to the agent's log, for the lender's operator.
func (a *Agent) answerError(w http.ResponseWriter, r *http.Request, err error) {
	m := errorMap.Lookup(err)
	msg := publicMessage(err)
	if msg != strings.ReplaceAll(err.Error(), "agent: ", "") {
		a.log.Warn("refused a call of the agent API", "path", r.URL.Path, "status", m.Status, "answered", msg, "err", err)
	}
	httpx.WriteError(w, m.Status, m.Code, msg)
}

// wipingWords is the refusal of a range of device dev whose wipe (after
// an earlier lease) has not finished.
func wipingWords(dev string) string {
	return fmt.Sprintf("the range of device %s is still being wiped after an earlier lease", dev)
}
