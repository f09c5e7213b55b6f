package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"syscall"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/networds"
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
	return failedWords
}

// failedWords is publicMessage's answer for a failure of the agent's own.
const failedWords = "it failed on its side (its agent's log says why)"

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
	case errors.Is(err, errWriteState) && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)):
		// The agent's state directory, not the device, is full.
		return fmt.Sprintf("the lender's agent cannot record the export of device %s: its state directory is out of space", dev)
	case errors.Is(err, errWriteState):
		return fmt.Sprintf("the lender's agent cannot record the export of device %s (its log says why)", dev)
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
	return fmt.Sprintf("the range of device %s %s", dev, api.RangeBeingWiped)
}

// destError is a failure of the destination of a part moving from here:
// reaching it (reach), or writing the copy to it. Its text is err's.
type destError struct {
	reach bool
	err   error
}

func (e *destError) Error() string { return e.err.Error() }
func (e *destError) Unwrap() error { return e.err }

// sourceError is a failure to read the part moving from here, for the
// copy. Its text is err's.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// transferWords is what the status of a transfer of a part of device dev
// that failed with err says (api.Transfer.Error), in the words of
// publicMessage: a Refusal its Public words; a failure to reach or write
// to the destination what it was, when it is one of the network's or of
// TLS's (networds: "the destination could not be reached from this
// lender: connection refused"), calling the lenders
// api.TransferDestination and api.TransferThisLender, which the control
// plane replaces with their names; a failure to read the part what is
// wrong with the device; anything else as publicMessage says it. The
// whole error is for the agent's log (failOut).
func transferWords(dev string, err error) string {
	var r *Refusal
	var de *destError
	var se *sourceError
	switch {
	case errors.As(err, &r):
		return r.Public
	case errors.As(err, &de):
		return destWords(de)
	case errors.As(err, &se):
		var errno syscall.Errno
		if errors.As(se.err, &errno) {
			return fmt.Sprintf("device %s could not be read for the copy (%v)", dev, errno)
		}
		return fmt.Sprintf("device %s could not be read for the copy (%s's agent log says why)", dev, api.TransferThisLender)
	}
	return publicMessage(err)
}

// destWords says what a failure of the destination was (transferWords).
func destWords(e *destError) string {
	dst, here := api.TransferDestination, api.TransferThisLender
	kind, words := networds.Describe(e.err)
	switch {
	case kind == networds.Unreachable, kind == networds.Broken && e.reach:
		return fmt.Sprintf("%s could not be reached from %s: %s", dst, here, words)
	case kind == networds.Broken:
		return fmt.Sprintf("the connection from %s to %s broke during the copy: %s", here, dst, words)
	case kind == networds.PeerCertificate:
		return fmt.Sprintf("%s's certificate was not accepted by %s (%s)", dst, here, words)
	case kind == networds.OwnCertificate:
		return fmt.Sprintf("%s did not accept %s's certificate (%s)", dst, here, words)
	case kind == networds.NotTLS:
		return fmt.Sprintf("%s does not speak TLS (its URI says it does)", dst)
	case e.reach:
		return fmt.Sprintf("%s could not be reached from %s (%s's agent log says why)", dst, here, here)
	case errors.Is(e.err, nbd.ErrShutdown), errors.Is(e.err, io.EOF):
		// Its data plane ended the copy's connection: its agent stopped
		// (or restarted), or it gave the move up.
		return fmt.Sprintf("%s closed the copy's connection from %s during the copy (its agent stopped, or it gave the move up)", dst, here)
	case errors.Is(e.err, nbd.ErrTimeout):
		return fmt.Sprintf("%s did not answer a write of the copy from %s within %v", dst, here, moveRequestTimeout)
	}
	var ne *nbd.Error
	if errors.As(e.err, &ne) {
		// NBD's error numbers are Linux's.
		return fmt.Sprintf("%s could not write the copy to its device (%v)", dst, syscall.Errno(ne.Errno))
	}
	return fmt.Sprintf("%s did not take the copy (%s's agent log says why)", dst, here)
}

// errNoCA is DialMove's refusal of a destination that serves TLS, from an
// agent with no cluster CA to verify it with.
var errNoCA = refuse(api.TransferDestination+" serves TLS and "+api.TransferThisLender+" has no cluster CA (its agent's --cacert)",
	errors.New("agent: the destination serves TLS and this agent has no cluster CA (--cacert)"))
