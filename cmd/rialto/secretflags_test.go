package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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

// secretFileOf writes secret to a file of the test's (0600) and returns
// its path, for --*-token-file.
func secretFileOf(t *testing.T, secret string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestSecretFlagsRefused: a secret given on the command line (where every
// user sees it in ps) is refused with a message that says what to use
// instead, and its value shows nowhere in the output; the file and the
// environment work.
func TestSecretFlagsRefused(t *testing.T) {
	const leaked = "cmdline-secret-value"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"server", "--bootstrap-token", leaked}, "use --bootstrap-token-file FILE or the environment variable RIALTO_BOOTSTRAP_TOKEN"},
		{[]string{"server", "--admin-token", leaked}, "use --admin-token-file FILE or the environment variable RIALTO_ADMIN_TOKEN"},
		{[]string{"server", "--token", leaked + ":tenant"}, "use --token-file FILE or the environment variable RIALTO_TOKENS"},
		{[]string{"agent", "--bootstrap-token", leaked}, "use --bootstrap-token-file FILE or the environment variable RIALTO_BOOTSTRAP_TOKEN"},
		{[]string{"appliance", "--bootstrap-token", leaked}, "use --bootstrap-token-file FILE"},
		{[]string{"nodes", "--token", leaked}, "use --token-file FILE or the environment variable RIALTO_TOKEN"},
		{[]string{"lease", "create", "--size", "1MiB", "--token", leaked}, "--token puts a secret on the command line"},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
			code := run(context.Background(), tc.args, e)
			all := out.String() + errb.String()
			if code != 1 || !strings.Contains(all, tc.want) {
				t.Fatalf("exit %d, output %q; want 1 and %q", code, all, tc.want)
			}
			if strings.Contains(all, leaked) {
				t.Fatalf("the refused value shows in the output: %s", all)
			}
		})
	}
	// The file's content, trimmed, is the token; an empty file is refused.
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	empty := secretFileOf(t, "")
	if code := run(context.Background(), []string{"agent", "--bootstrap-token-file", empty}, e); code != 1 || !strings.Contains(errb.String(), "is empty") {
		t.Fatalf("empty token file: exit %d, %s", code, errb.String())
	}
}
