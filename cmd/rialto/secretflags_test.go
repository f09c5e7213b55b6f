package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
		// A database password, too: the database holds every lease's
		// credential and every node's agent key.
		{[]string{"server", "--db", "postgres://rialto:" + leaked + "@127.0.0.1:1/rialto"}, "use the environment variable RIALTO_DB"},
		{[]string{"server", "--db", "postgresql://rialto@127.0.0.1:1/rialto?sslmode=disable&password=" + leaked}, "use the environment variable RIALTO_DB"},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			code := run(ctx, tc.args, e)
			all := out.String() + errb.String()
			if code != 2 || !strings.Contains(all, tc.want) {
				t.Fatalf("exit %d, output %q; want 2 and %q", code, all, tc.want)
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

// TestDatabasePasswordNeverShown: the database URL from RIALTO_DB (where
// its password belongs) shows in messages and logs without the password,
// given as the user's or as a parameter: a database the server cannot
// reach is reported with its URL.
func TestDatabasePasswordNeverShown(t *testing.T) {
	const leaked = "env-db-password-secret"
	for _, db := range []string{
		"postgres://rialto:" + leaked + "@127.0.0.1:1/rialto",
		"postgresql://rialto@127.0.0.1:1/rialto?sslmode=disable&password=" + leaked,
		"postgres://rialto@127.0.0.1:1/rialto?sslpassword=" + leaked + "&sslmode=disable",
	} {
		var out, errb bytes.Buffer
		vars := map[string]string{"RIALTO_DB": db, "RIALTO_BOOTSTRAP_TOKEN": "boot-secret", "RIALTO_ADMIN_TOKEN": "admin-secret"}
		e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		code := run(ctx, []string{"server", "--listen", "127.0.0.1:0", "--tls-dir", t.TempDir()}, e)
		cancel()
		all := out.String() + errb.String()
		if code == 0 || !strings.Contains(all, "127.0.0.1:1") {
			t.Fatalf("exit %d, output %q: want the unreachable database reported", code, all)
		}
		if strings.Contains(all, leaked) {
			t.Errorf("the database password shows: %s", all)
		}
	}
}
