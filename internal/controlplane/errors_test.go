package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/placement"
)

// TestAPIErrorMessages: an error answer's message is for people: it names
// no package and leaves out what its code says ("lease x not found", not
// "controlplane: not found: lease x" or "lease x: store: not found"),
// while the error itself keeps its chain for errors.Is and the log.
func TestAPIErrorMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	anon := e.alice.WithToken("")
	for _, tc := range []struct {
		name   string
		call   func() error
		status int
		want   string // the whole message, or its start when it ends with …
	}{
		{"unknown lease", func() error { _, err := e.alice.Lease(e.ctx(), "lease-nonexist"); return err }, 404, "lease lease-nonexist not found"},
		{"unknown node", func() error { _, err := e.alice.Node(e.ctx(), "node-nonexist"); return err }, 404, "node node-nonexist not found"},
		{"no token", func() error { _, err := anon.Nodes(e.ctx()); return err }, 401, "missing Authorization: Bearer <token> header"},
		{"infeasible", func() error {
			_, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 256 << 30})
			return err
		}, 422, "infeasible: capacity: no block device for …"},
		{"bad body", func() error {
			return e.alice.Do(e.ctx(), http.MethodPost, "/v1/leases", map[string]any{"kind": "block", "size": "big"}, nil)
		}, 400, "bad request body: field \"size\" must be int64, not string"},
		{"invalid", func() error {
			_, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: "tape"})
			return err
		}, 400, "unknown kind \"tape\" (block, memory, accel or nic)"},
		{"conflict", func() error {
			l, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
			if err != nil {
				return err
			}
			if _, err := e.alice.ReleaseLease(e.ctx(), l.ID); err != nil {
				return err
			}
			_, err = e.alice.RenewLease(e.ctx(), l.ID, 60)
			return err
		}, 409, "lease lease-… is released; only reserved or active leases renew"},
		{"forbidden", func() error { return e.alice.Do(e.ctx(), http.MethodDelete, "/v1/nodes/node-x", nil, nil) }, 403, "removing a node needs an admin token"},
	} {
		err := tc.call()
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != tc.status {
			t.Fatalf("%s: %v, want HTTP %d", tc.name, err, tc.status)
		}
		for _, pkg := range []string{"controlplane:", "store:", "placement:", "httpx:"} {
			if strings.Contains(ae.Message, pkg) {
				t.Errorf("%s: message %q names %s", tc.name, ae.Message, pkg)
			}
		}
		if pre, wild := strings.CutSuffix(tc.want, "…"); wild {
			if !strings.HasPrefix(ae.Message, pre) {
				t.Errorf("%s: message %q, want %q…", tc.name, ae.Message, pre)
			}
		} else if pre, rest, wild := strings.Cut(tc.want, "…"); wild {
			if !strings.HasPrefix(ae.Message, pre) || !strings.HasSuffix(ae.Message, rest) {
				t.Errorf("%s: message %q, want %q", tc.name, ae.Message, tc.want)
			}
		} else if ae.Message != tc.want {
			t.Errorf("%s: message %q, want %q", tc.name, ae.Message, tc.want)
		}
	}
}

// TestPublicMessageKeepsChain: the answer's message is cleaned, the error
// is not: errors.Is still finds every sentinel, and its text (the log's)
// still names them.
func TestPublicMessageKeepsChain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err      error
		sentinel error
		code     string
		msg      string
	}{
		{fmt.Errorf("%w: lease x not found", ErrNotFound), ErrNotFound, api.CodeNotFound, "lease x not found"},
		{fmt.Errorf("node x: %w", store.ErrNotFound), store.ErrNotFound, api.CodeNotFound, "node x not found"},
		{fmt.Errorf("%w: %w", ErrQuota, fmt.Errorf("tenant a would hold 3 of 2 leases: %w", store.ErrQuota)), store.ErrQuota, api.CodeQuota,
			"tenant a would hold 3 of 2 leases: tenant quota exceeded"},
		{ErrUnauthorized, ErrUnauthorized, api.CodeUnauthorized, "unauthorized"},
		// A failed lease's reason quotes another error's text.
		{fmt.Errorf("%w: lease x failed: lenders did not confirm (n: refused) and no other placement: %v: placement: infeasible: capacity: none",
			ErrUnavailable, ErrInfeasible), ErrUnavailable, api.CodeUnavailable,
			"lease x failed: lenders did not confirm (n: refused) and no other placement: infeasible: capacity: none"},
		// A failed lease's reason, already in plain words, keeps them: its
		// "placement" is no package's name (it read "no other infeasible").
		{fmt.Errorf("%w: lease x failed: lenders did not confirm (n: refused) and no other placement: infeasible: capacity: none", ErrUnavailable),
			ErrUnavailable, api.CodeUnavailable, "lease x failed: lenders did not confirm (n: refused) and no other placement: infeasible: capacity: none"},
		{store.ErrNotFound, store.ErrNotFound, api.CodeNotFound, "not found"},
		{fmt.Errorf("%w: %w", ErrInfeasible, placement.ErrInfeasible), placement.ErrInfeasible, api.CodeInfeasible, "infeasible"},
	} {
		_, info := apiError(tc.err)
		if info.Code != tc.code || info.Message != tc.msg {
			t.Errorf("%v: answered %s %q, want %s %q", tc.err, info.Code, info.Message, tc.code, tc.msg)
		}
		if !errors.Is(tc.err, tc.sentinel) || !strings.Contains(tc.err.Error(), tc.sentinel.Error()) {
			t.Errorf("%v: lost %v", tc.err, tc.sentinel)
		}
	}
}

// TestPlainText: a lender's answer or failure reads as the lender's name
// and its words, without packages, paths, statuses or codes, and with the
// control plane's sentinels left out; the error keeps the whole story.
func TestPlainText(t *testing.T) {
	n := api.Node{ID: "node-abc", Name: "n2"}
	refused := answerError(n, "/agent/v1/prepare", "500 Internal Server Error",
		[]byte(`{"error":{"code":"internal","message":"device d0 is busy (another program holds it)"}}`))
	for _, c := range []struct {
		err  error
		want string
	}{
		{refused, "lender n2 refused the part: device d0 is busy (another program holds it)"},
		{fmt.Errorf("the destination did not receive: %w", refused), "the destination did not receive: lender n2 refused the part: device d0 is busy (another program holds it)"},
		{&lenderError{node: n, path: "/agent/v1/prepare", err: context.DeadlineExceeded}, "lender n2 did not answer in time"},
		{&lenderError{node: api.Node{ID: "node-abc"}, path: "/agent/v1/transfers/in", err: &url.Error{Op: "Post", URL: "https://x/agent/v1/transfers/in", Err: errors.New("dial tcp: connection refused")}},
			"lender node-abc could not be reached: dial tcp: connection refused"},
		{fmt.Errorf("%w: no destination for part 0 of lease x: %w", ErrInfeasible, fmt.Errorf("%w: %w: mode: none", ErrInfeasible, placement.ErrInfeasible)),
			"no destination for part 0 of lease x: infeasible: mode: none"},
		{errors.New("agent: copy: stripe: device 0: nbd: short read"), "copy: device 0: short read"},
	} {
		if got := plainText(c.err); got != c.want {
			t.Errorf("plainText(%q) = %q, want %q", c.err, got, c.want)
		}
	}
	if !strings.Contains(refused.Error(), "node-abc /agent/v1/prepare: 500 Internal Server Error: internal: device d0 is busy") {
		t.Errorf("the lender's error for the log lost its detail: %v", refused)
	}
}

// TestPrefixedPackagesExist: every name plainWords removes is a package
// of the module's.
func TestPrefixedPackagesExist(t *testing.T) {
	pkgs := map[string]bool{}
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			pkgs[d.Name()] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range prefixedPackages {
		if !pkgs[p] {
			t.Errorf("%q is no package of the module's", p)
		}
	}
}

// TestErrorMapCodesOfStatus: each status the control plane answers has
// the code the client gives an answer of that status without the API's
// body (api.CodeOfStatus), so a refusal reads the same whoever wrote it.
func TestErrorMapCodesOfStatus(t *testing.T) {
	for _, m := range errorMap {
		if got := api.CodeOfStatus(m.Status); got != m.Code {
			t.Errorf("%v: status %d code %s; api.CodeOfStatus(%d) = %s", m.Err, m.Status, m.Code, m.Status, got)
		}
	}
	if got := api.CodeOfStatus(http.StatusInternalServerError); got != errorMap.Lookup(errors.New("x")).Code {
		t.Errorf("api.CodeOfStatus(500) = %s", got)
	}
}
