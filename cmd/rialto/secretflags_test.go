package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Usage output (a bad flag, -h) may go to service logs: tokens taken
// from the environment must not appear in it as flag defaults.
func TestUsageNeverShowsTokens(t *testing.T) {
	secrets := map[string]string{
		"RIALTO_TOKEN":           "env-api-token-secret",
		"RIALTO_BOOTSTRAP_TOKEN": "env-bootstrap-secret",
		"RIALTO_ADMIN_TOKEN":     "env-admin-secret",
	}
	for _, args := range [][]string{
		{"nodes", "--no-such-flag"},
		{"nodes", "-h"},
		{"leases", "-h"},
		{"server", "--no-such-flag"},
		{"server", "-h"},
		{"agent", "--no-such-flag"},
		{"agent", "-h"},
		{"appliance", "--no-such-flag"},
		{"appliance", "-h"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string { return secrets[k] }}
			run(context.Background(), args, e)
			all := out.String() + errb.String()
			want := "see 'rialto " + args[0] + " -h'"
			if args[1] == "-h" {
				want = "Flags:"
			}
			if !strings.Contains(all, want) {
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
