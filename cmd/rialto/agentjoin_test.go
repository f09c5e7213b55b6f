package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
)

// TestAgentWrongBootstrapTokenHint: an agent whose bootstrap token the
// control plane refuses (rotated on the server, not yet given to the
// agent) exits saying where the agent takes that token, not the hint for
// the CLI's tenant tokens (RIALTO_TOKEN, --token-file, rialto up's
// STATE/env), which it printed: an operator rotating the bootstrap token
// as docs/operations.md says was sent to the wrong file.
func TestAgentWrongBootstrapTokenHint(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := controlplane.New(t.Context(), controlplane.Config{Store: st, BootstrapToken: "boot-new-0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	dir := t.TempDir()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	code := run(context.Background(), []string{"agent", "--addr", ts.URL, "--insecure-dataplane",
		"--bootstrap-token-file", secretFileOf(t, "boot-old-0123456789"), "--name", "a1", "--state-dir", filepath.Join(dir, "state"),
		"--block", "disk0=" + filepath.Join(dir, "disk0.img") + ":8MiB", "--machine-id", "m-a1"}, e)
	errs := errb.String()
	if code == 0 || !strings.Contains(errs, "HTTP 401") {
		t.Fatalf("agent with a refused bootstrap token: exit %d\n%s", code, errs)
	}
	if strings.Contains(errs, "RIALTO_TOKEN ") || strings.Contains(errs, "--token-file") {
		t.Errorf("the refusal points the agent at the CLI's token: %q", errs)
	}
	for _, w := range []string{"bootstrap token", "--bootstrap-token-file", "RIALTO_BOOTSTRAP_TOKEN"} {
		if !strings.Contains(errs, w) {
			t.Errorf("the refusal does not say %q: %q", w, errs)
		}
	}
}
