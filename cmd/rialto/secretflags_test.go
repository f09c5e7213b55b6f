package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Usage output (a bad flag, -h) goes to stderr, hence to service logs:
// tokens taken from the environment must not appear in it as flag
// defaults.
func TestUsageNeverShowsTokens(t *testing.T) {
	secrets := map[string]string{
		"RIALTO_TOKEN":           "env-api-token-secret",
		"RIALTO_BOOTSTRAP_TOKEN": "env-bootstrap-secret",
		"RIALTO_ADMIN_TOKEN":     "env-admin-secret",
	}
	for _, args := range [][]string{
		{"nodes", "--no-such-flag"},
		{"leases", "-h"},
		{"server", "--no-such-flag"},
		{"agent", "--no-such-flag"},
		{"appliance", "--no-such-flag"},
	} {
		t.Run(args[0], func(t *testing.T) {
			var out, errb bytes.Buffer
			e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string { return secrets[k] }}
			run(context.Background(), args, e)
			all := out.String() + errb.String()
			if !strings.Contains(all, "Flags:") {
				t.Fatalf("no usage printed:\n%s", all)
			}
			for k, v := range secrets {
				if strings.Contains(all, v) {
					t.Errorf("usage shows $%s:\n%s", k, all)
				}
			}
		})
	}
}
