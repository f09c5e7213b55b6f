package accel

import (
	"context"
	"errors"
	"fmt"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
)

// Errors a Target returns and a client sees again (through RemoteError) on
// the other side of the wire.
var (
	ErrAuth           = errors.New("accel: credential rejected")
	ErrOutOfRange     = errors.New("accel: address out of range")
	ErrNoRole         = errors.New("accel: no role loaded")
	ErrBusy           = errors.New("accel: too many outstanding tasks")
	ErrOutputTooSmall = errors.New("accel: output buffer too small")
	ErrUnknownTask    = errors.New("accel: unknown task")
	ErrRoleFailed     = errors.New("accel: role failed")
	ErrClosed         = errors.New("accel: connection closed")
	ErrUnavailable    = errors.New("accel: target unavailable")
	// ErrTLSRequired: the target requires TLS and the client connected in
	// plaintext (a rialto-accel:// URI, or no TLS configuration).
	ErrTLSRequired = errors.New("accel: the target requires TLS (use its rialto-accels:// URI and the cluster CA)")
	// ErrInputBudget: an INLINE START refused because the connection's
	// running tasks hold as many bytes of inline input as the server
	// allows one connection (Server.MaxInlineInput); it may be sent again
	// once one of them has finished.
	ErrInputBudget = errors.New("accel: inline input budget of the connection spent")
	// ErrLeaseExpired refuses a request (a memory access, a task, a
	// block move) that reaches a target once its lease's known expiry
	// has passed, before the lease's end has closed the connection
	// (wire code Unavailable).
	ErrLeaseExpired = fmt.Errorf("%w: the lease expired", ErrUnavailable)
)

// Code is the u16 error code of an ERROR frame.
type Code uint16

// Error codes (stable; documented in docs/accel-protocol.md).
const (
	CodeInternal       Code = 1
	CodeAuth           Code = 2
	CodeFrame          Code = 3
	CodeTooLarge       Code = 4
	CodeOutOfRange     Code = 5
	CodeNoRole         Code = 6
	CodeUnknownEntry   Code = 7
	CodeBadInput       Code = 8
	CodeBusy           Code = 9
	CodeOutputTooSmall Code = 10
	CodeUnknownTask    Code = 11
	CodeRoleFailed     Code = 12
	CodeUnavailable    Code = 13
	CodeCanceled       Code = 14
	CodeUnsupported    Code = 15
	CodeBlockIO        Code = 16
	CodeTLSRequired    Code = 17
	CodeInputBudget    Code = 18
)

var codeErrs = []struct {
	code Code
	err  error
}{
	{CodeAuth, ErrAuth},
	{CodeFrame, ErrFrame},
	{CodeTooLarge, ErrTooLarge},
	{CodeOutOfRange, ErrOutOfRange},
	{CodeNoRole, ErrNoRole},
	{CodeUnknownEntry, roles.ErrUnknownEntry},
	{CodeBadInput, roles.ErrBadInput},
	{CodeBusy, ErrBusy},
	{CodeOutputTooSmall, ErrOutputTooSmall},
	{CodeUnknownTask, ErrUnknownTask},
	{CodeRoleFailed, ErrRoleFailed},
	{CodeUnavailable, ErrUnavailable},
	{CodeUnsupported, ErrUnsupported},
	{CodeBlockIO, ErrBlockIO},
	{CodeTLSRequired, ErrTLSRequired},
	{CodeInputBudget, ErrInputBudget},
	{CodeCanceled, context.Canceled},
	{CodeCanceled, context.DeadlineExceeded},
}

// CodeOf maps an error to its wire code: the one place where errors become
// codes.
func CodeOf(err error) Code {
	for _, ce := range codeErrs {
		if errors.Is(err, ce.err) {
			return ce.code
		}
	}
	if errors.Is(err, roles.ErrWasmTrap) {
		return CodeRoleFailed
	}
	return CodeInternal
}

// RemoteError is an ERROR frame received by a client. errors.Is matches it
// against the sentinel of its code (ErrOutOfRange, roles.ErrBadInput, ...).
type RemoteError struct {
	Code Code
	Msg  string
}

func (e *RemoteError) Error() string { return fmt.Sprintf("accel: remote error %d: %s", e.Code, e.Msg) }

// Unwrap returns the sentinel error of the code.
func (e *RemoteError) Unwrap() error {
	for _, ce := range codeErrs {
		if ce.code == e.Code {
			return ce.err
		}
	}
	return nil
}
