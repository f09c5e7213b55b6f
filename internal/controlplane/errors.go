package controlplane

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/httpx"
	"github.com/rialto-project/rialto/internal/placement"
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
	// ErrGone: what the request resumes from was pruned (history
	// retention): an event cursor below the pruned events.
	ErrGone = errors.New("controlplane: gone")
)

// errorMap is the one place where errors become HTTP statuses and codes.
var errorMap = httpx.ErrorMap{
	{Err: ErrInvalid, Status: http.StatusBadRequest, Code: api.CodeInvalid},
	{Err: ErrUnauthorized, Status: http.StatusUnauthorized, Code: api.CodeUnauthorized},
	{Err: ErrForbidden, Status: http.StatusForbidden, Code: api.CodeForbidden},
	{Err: ErrNotFound, Status: http.StatusNotFound, Code: api.CodeNotFound},
	{Err: store.ErrNotFound, Status: http.StatusNotFound, Code: api.CodeNotFound},
	{Err: ErrConflict, Status: http.StatusConflict, Code: api.CodeConflict},
	{Err: store.ErrConflict, Status: http.StatusConflict, Code: api.CodeConflict},
	{Err: store.ErrDuplicate, Status: http.StatusConflict, Code: api.CodeConflict},
	{Err: ErrInfeasible, Status: http.StatusUnprocessableEntity, Code: api.CodeInfeasible},
	{Err: store.ErrCapacity, Status: http.StatusUnprocessableEntity, Code: api.CodeInfeasible},
	{Err: ErrQuota, Status: http.StatusTooManyRequests, Code: api.CodeQuota},
	{Err: ErrUnavailable, Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable},
	{Err: ErrGone, Status: http.StatusGone, Code: api.CodeGone},
	{Err: context.DeadlineExceeded, Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable},
}

// apiError maps err with errorMap. Internal errors (those it does not
// map) keep their detail out of the answer.
func apiError(err error) (int, api.ErrorInfo) {
	if errors.Is(err, store.ErrUnavailable) {
		// A replica cut off from its database says so (clients fail over).
		return http.StatusServiceUnavailable, api.ErrorInfo{Code: api.CodeUnavailable, Message: unavailableMessage(err)}
	}
	m := errorMap.Lookup(err)
	if m.Code == api.CodeInternal {
		return m.Status, api.ErrorInfo{Code: api.CodeInternal, Message: "internal error; see the control plane log"}
	}
	return m.Status, api.ErrorInfo{Code: m.Code, Message: publicMessage(err)}
}

// sentinels are the control plane's sentinel errors, whose texts
// publicMessage leaves out.
var sentinels = []error{ErrInvalid, ErrUnauthorized, ErrForbidden, ErrNotFound, ErrConflict, ErrInfeasible, ErrQuota, ErrUnavailable, ErrGone}

// prefixed are the other packages' sentinels an answer may carry, each
// with its text in the answer: the words without the package's name. A
// package's name is removed only where it starts a clause (after ": ",
// "; " or "("; publicText makes the message's start one): "no other
// placement: infeasible", a reason's words, keeps its "placement".
var prefixed = func() *strings.Replacer {
	var pairs []string
	for _, e := range []error{store.ErrNotFound, store.ErrConflict, store.ErrCapacity, store.ErrDuplicate, store.ErrQuota,
		placement.ErrInfeasible, placement.ErrInvalid, httpx.ErrBadBody} {
		pkg, words, _ := strings.Cut(e.Error(), ": ")
		if e == store.ErrNotFound {
			pairs = append(pairs, ": "+e.Error(), " "+words) // "lease x: store: not found" → "lease x not found"
		}
		for _, b := range []string{": ", "; ", "("} {
			pairs = append(pairs, b+pkg+": "+words, b+words)
		}
	}
	return strings.NewReplacer(pairs...)
}()

// publicMessage is err's message as the API answers it. An error carries
// the texts of the sentinels it wraps, for the log and errors.Is
// ("controlplane: not found: lease x not found", "node x: store: not
// found", "controlplane: infeasible: placement: infeasible: mode: …"); the
// answer's code says what the control plane's sentinels say, so the
// message leaves them out, and it names no package: "lease x not found",
// "node x not found", "infeasible: mode: …".
func publicMessage(err error) string { return publicText(err.Error()) }

// publicText is publicMessage of an error's text.
func publicText(msg string) string {
	for _, e := range sentinels {
		t := e.Error()
		if msg == t {
			return strings.TrimPrefix(t, "controlplane: ")
		}
		msg = strings.ReplaceAll(msg, t+": ", "")
	}
	msg = prefixed.Replace(": " + msg)
	if m, ok := strings.CutPrefix(msg, ": "); ok {
		return m
	}
	return strings.TrimPrefix(msg, " ") // "store: not found" → " not found"
}

// plainText is err as a user reads it in a lease's reason, a drain's
// record, a move's error or an event: publicMessage, each lender's answer
// or failure in plain words (lenderError.plain: "lender node2 refused the
// part: …", not "controlplane: agent node-… /agent/v1/prepare: 500
// Internal Server Error: internal: agent: …"), and no package's name
// (packagePrefixes: a lender's words quote the agent's errors, which
// name theirs). The whole error goes to the control plane's log.
func plainText(err error) string {
	msg := err.Error()
	var le *lenderError
	if errors.As(err, &le) {
		msg = strings.Replace(msg, le.Error(), le.plain(), 1)
	}
	return plainWords(msg)
}

// plainWords is publicText without the names of packages.
func plainWords(msg string) string {
	msg = publicText(msg)
	for {
		next := packagePrefixes.ReplaceAllString(msg, "$1")
		if next == msg {
			return msg
		}
		msg = next
	}
}

// prefixedPackages are the module's packages whose errors may reach a
// lease's reason, a drain's record or a move's error, from the control
// plane or quoted in a lender's answer, their texts starting with the
// package's name ("agent: prepare …: nbd: open backend: …").
var prefixedPackages = []string{"agent", "nbd", "stripe", "tlspsk", "memory", "donor", "mapping", "nic", "accel", "roles", "gateway", "mct", "uffd",
	"controlplane", "lifecycle", "store", "sqlstore", "sqlite", "postgres", "placement", "httpx", "pki", "fabric", "resource"}

// packagePrefixes finds a package's name that starts a message or one of
// its clauses.
var packagePrefixes = regexp.MustCompile(`(^|: |; |\()(?:` + strings.Join(prefixedPackages, "|") + `): `)

// withArticle puts the indefinite article before s for a message: "an
// admin tenant token", "a node credential".
func withArticle(s string) string {
	if s != "" && strings.IndexByte("aeiou", s[0]) >= 0 {
		return "an " + s
	}
	return "a " + s
}
