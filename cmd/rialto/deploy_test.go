package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/config"
	"github.com/rialto-project/rialto/internal/resource"
)

// TestDeploySampleConfigs applies the sample configurations under
// deploy/config to the real flag sets of `rialto server` and `rialto
// agent`: a key no flag has (a flag renamed) or a value its flag refuses
// fails here. Each verb runs with --log-level bogus on the command line,
// which overrides the file's and stops it right after the file is applied
// (and, for the server, its quotas parsed), before it touches anything.
// The agent's device specs are parsed as the agent parses them.
func TestDeploySampleConfigs(t *testing.T) {
	for _, verb := range []string{"server", "agent"} {
		t.Run(verb, func(t *testing.T) {
			path := filepath.Join("..", "..", "deploy", "config", verb+".toml")
			var out, errb bytes.Buffer
			e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string {
				return map[string]string{"RIALTO_BOOTSTRAP_TOKEN": "boot-secret", "RIALTO_ADMIN_TOKEN": "admin-secret"}[k]
			}}
			// The secrets' files the samples name are not on this
			// machine: the command line points at others.
			dir := t.TempDir()
			args := []string{verb, "--config", path, "--log-level", "bogus"}
			for _, f := range map[string][]string{"server": {"token", "admin-token", "bootstrap-token"}, "agent": {"bootstrap-token"}}[verb] {
				p := filepath.Join(dir, f)
				if err := os.WriteFile(p, []byte(f+"-secret:tenant\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--"+f+"-file", p)
			}
			code := run(context.Background(), args, e)
			if want := `bad --log-level "bogus"`; code != 2 || !strings.Contains(errb.String(), want) {
				t.Fatalf("rialto %s --config %s: exit %d, want 2 (a usage mistake, after the file is applied) with %q:\n%s", verb, path, code, want, errb.String())
			}
			file, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(file.Entries) < 5 {
				t.Fatalf("%s: %d keys", path, len(file.Entries))
			}
			for _, ent := range file.Entries {
				for i, v := range ent.Values {
					switch ent.Key {
					case "block":
						_, err = parseBlock(v, i)
					case "nic":
						_, err = parseNIC(v)
					case "memory", "slot-memory":
						_, err = resource.ParseSize(v)
					case "label":
						_, err = parseLabels([]string{v})
					case "quota":
						_, err = parseQuotas([]string{v})
					}
					if err != nil {
						t.Errorf("%s:%d: %s: %v", path, ent.Line, ent.Key, err)
					}
				}
			}
		})
	}
}

// TestDeploySystemdUnits checks the units under deploy/systemd with
// `systemd-analyze verify` and the system user with `systemd-sysusers
// --dry-run` (their ExecStart pointed at a real binary) and
// bounds their exposure with `systemd-analyze security --offline` (the
// threshold in tenths of its 0-10 scale: the server 1.4 when written, the
// agent, root for devices and NICs, 4.1), so a hardening directive
// dropped by mistake fails here.
func TestDeploySystemdUnits(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	if su, err := exec.LookPath("systemd-sysusers"); err == nil {
		root := t.TempDir()
		if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		conf, err := filepath.Abs(filepath.Join("..", "..", "deploy", "systemd", "rialto.sysusers"))
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(su, "--root="+root, "--dry-run", conf).CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("Creating user 'rialto'")) {
			t.Errorf("systemd-sysusers rialto.sysusers: %v\n%s", err, out)
		}
	}
	for unit, threshold := range map[string]string{"rialto-server.service": "20", "rialto-agent.service": "50"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, want := range []string{"Environment=RIALTO_CONFIG=/etc/rialto/", "NoNewPrivileges=yes", "ProtectSystem=strict"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s has no %s", unit, want)
			}
		}
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "Exec") && strings.Contains(l, "token") {
				t.Errorf("%s puts a token on the command line: %s", unit, l)
			}
		}
		path := filepath.Join(dir, unit)
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(text, "/usr/local/bin/rialto", bin)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(sa, "verify", path).CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
		}
		if help, _ := exec.Command(sa, "security", "--help").CombinedOutput(); !bytes.Contains(help, []byte("--offline")) {
			continue
		}
		out, err := exec.Command(sa, "security", "--offline=yes", "--threshold="+threshold, path).CombinedOutput()
		if err != nil {
			t.Errorf("systemd-analyze security %s: exposure above %s: %v\n%s", unit, threshold, err, out)
		}
	}
}

// TestOperationsListsConfigKeys: docs/operations.md lists every key of
// both daemons' configuration files, that is every flag of `rialto server
// -h` and `rialto agent -h` (but --config).
func TestOperationsListsConfigKeys(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ")
	flagLine := regexp.MustCompile(`(?m)^\s+--?([a-z][a-z0-9-]*)`)
	for _, verb := range []string{"server", "agent"} {
		var out, errb bytes.Buffer
		run(context.Background(), []string{verb, "-h"}, &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }})
		start := strings.Index(text, "The keys of `rialto "+verb+"`:")
		if start < 0 {
			t.Fatalf("docs/operations.md has no list of the keys of rialto %s", verb)
		}
		list := text[start:]
		if end := strings.Index(list, "."); end >= 0 {
			list = list[:end]
		}
		n := 0
		for _, m := range flagLine.FindAllStringSubmatch(out.String()+errb.String(), -1) {
			if m[1] == "config" || m[1] == "h" || m[1] == "help" {
				continue
			}
			n++
			if !strings.Contains(list, "`"+m[1]+"`") {
				t.Errorf("docs/operations.md does not list the key %s of rialto %s", m[1], verb)
			}
		}
		if n < 10 {
			t.Fatalf("rialto %s -h: %d flags found:\n%s", verb, n, errb.String())
		}
	}
}

// TestGuidesShowEveryDaemonFlag: the synopsis of each daemon in the guides
// (the first ```sh block that starts with `rialto VERB `) shows every flag
// of `rialto VERB -h`, but the refused secret flags (their -file flags are
// shown) and -h.
func TestGuidesShowEveryDaemonFlag(t *testing.T) {
	flagLine := regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--([a-z][a-z0-9-]*)`)
	refused := map[string]bool{"bootstrap-token": true, "admin-token": true, "token": true, "help": true}
	for _, c := range []struct{ doc, verb string }{
		{"user-guide.md", "up"}, {"user-guide.md", "server"}, {"user-guide.md", "agent"},
		{"cli-dataplanes.md", "appliance"},
	} {
		doc, err := os.ReadFile(filepath.Join("..", "..", "docs", c.doc))
		if err != nil {
			t.Fatal(err)
		}
		start := strings.Index(string(doc), "```sh\nrialto "+c.verb+" ")
		if start < 0 {
			t.Errorf("docs/%s has no synopsis of rialto %s (a ```sh block starting with it)", c.doc, c.verb)
			continue
		}
		block := string(doc)[start+len("```sh\n"):]
		block = block[:strings.Index(block, "```")]
		var out, errb bytes.Buffer
		run(context.Background(), []string{c.verb, "-h"}, &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }})
		n := 0
		for _, m := range flagLine.FindAllStringSubmatch(out.String()+errb.String(), -1) {
			if refused[m[1]] {
				continue
			}
			n++
			if !regexp.MustCompile(`--` + regexp.QuoteMeta(m[1]) + `\b([^-]|$)`).MatchString(block) {
				t.Errorf("docs/%s: the synopsis of rialto %s does not show --%s", c.doc, c.verb, m[1])
			}
		}
		if n < 10 {
			t.Fatalf("rialto %s -h: %d flags found:\n%s", c.verb, n, errb.String())
		}
	}
}
