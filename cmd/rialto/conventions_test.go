package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v4"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// The CLI's conventions (docs/user-guide.md, "Command-line conventions"),
// each checked through run as a user would type the command line.

// TestUsageMistakesExitTwo: a usage mistake prints one line on stderr
// that ends with where the verb's help is, nothing on stdout, and exits 2.
func TestUsageMistakesExitTwo(t *testing.T) {
	srv := fakeAPI(t)
	for _, tc := range []struct {
		args []string
		want string // in the line
		verb string // the help the line points to
	}{
		{[]string{"lease", "create", "--size", "abc"}, `invalid argument "abc" for "--size"`, "lease create"},
		{[]string{"lease", "create", "--kind", "blok"}, "unknown kind (" + strings.Join(kindStrings(), ", ") + ")", "lease create"},
		{[]string{"lease", "create", "--mode", "bogus"}, "unknown mode (dedicated, shared, composed)", "lease create"},
		{[]string{"lease", "create", "--ttl", "0"}, "must be at least 1s", "lease create"},
		{[]string{"lease", "create", "--ttl", "soon"}, "want a duration", "lease create"},
		{[]string{"lease", "create", "--size", "0"}, "--size 0 asks for nothing", "lease create"},
		{[]string{"lease", "create", "--deadline", "later"}, "want a duration", "lease create"},
		{[]string{"lease", "create", "--bandwidth", "fast"}, "want a rate", "lease create"},
		{[]string{"lease", "create", "--label", "nvme"}, "use KEY=VALUE", "lease create"},
		{[]string{"explain", "--kind", "blok"}, "unknown kind", "explain"},
		{[]string{"lease", "renew", "lease-1", "--ttl", "0"}, "must be at least 1s", "lease renew"},
		{[]string{"lease", "show"}, "wrong number of arguments: want ID", "lease show"},
		{[]string{"lease", "show", "a", "b"}, "wrong number of arguments", "lease show"},
		{[]string{"nodes", "extra"}, "wrong number of arguments", "nodes"},
		{[]string{"lease", "show", ""}, "an empty argument: want ID", "lease show"},
		{[]string{"node", "remove", ""}, "an empty argument: want NODE", "node remove"},
		{[]string{"nodes", "--nope"}, "unknown flag: --nope", "nodes"},
		{[]string{"nodes", "-o", "xml"}, "want table, json, yaml or template", "nodes"},
		{[]string{"nodes", "-o", "template={{.id"}, "unclosed action", "nodes"},
		{[]string{"nodes", "--addr"}, "flag needs an argument", "nodes"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`, ""},
		{[]string{"--nope"}, "unknown flag: --nope", ""},
		{[]string{"lease"}, "needs a verb", "lease"},
		{[]string{"lease", "frob"}, `unknown command "lease frob"`, "lease"},
		{[]string{"agent", "--memory", "lots"}, `invalid argument "lots" for "--memory"`, "agent"},
		{[]string{"up", "--disk-size", "big"}, `invalid argument "big" for "--disk-size"`, "up"},
		{[]string{"up", "--link-rate", "fast"}, "want a rate", "up"},
		{[]string{"server", "--wipe-wait", "-1s"}, "--wipe-wait must not be negative", "server"},
		{[]string{"server", "--wipe-wait", "soon"}, `invalid argument "soon" for "--wipe-wait"`, "server"},
		{[]string{"characterize", "dev-1", "--request-size", "x"}, `invalid argument "x"`, "characterize"},
		{[]string{"memtest", "lease-1", "--span", "0"}, "--span must be positive", "memtest"},
		{[]string{"node", "drain", "n1", "--deadline", "soon"}, `invalid argument "soon"`, "node drain"},
		{[]string{"cost", "-o", "xml"}, "want table, json, yaml or template", "cost"},
		{[]string{"vm", "run"}, "--disk and --kernel are required", "vm run"},
		{[]string{"accel", "run", "lease-1", "sha256"}, "give one of INPUT, --data and --input-lease", "accel run"},
	} {
		out, errs, code := runCLI(t, srv.URL, tc.args...)
		help := "see 'rialto -h'"
		if tc.verb != "" {
			help = "see 'rialto " + tc.verb + " -h'"
		}
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, "rialto: ") ||
			!strings.Contains(errs, tc.want) || !strings.HasSuffix(errs, help+"\n") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q ending %q", tc.args, code, out, errs, tc.want, help)
		}
	}
	// Not mistakes: --size 0 with --whole; a bare number of seconds.
	for _, args := range [][]string{
		{"lease", "create", "--dry-run", "--size", "0", "--whole"},
		{"explain", "--kind", "memory", "--deadline", "90", "--ttl", "600"},
	} {
		if _, errs, code := runCLI(t, srv.URL, args...); code != 0 {
			t.Errorf("%q: exit %d: %s", args, code, errs)
		}
	}
}

func kindStrings() []string {
	var s []string
	for _, k := range api.Kinds {
		s = append(s, string(k))
	}
	return s
}

// TestKindsAreTheServers: the kinds in help, messages and completion are
// api.Kinds, the list the control plane validates requests against.
func TestKindsAreTheServers(t *testing.T) {
	out, _, code := runCLI(t, "", "lease", "create", "-h")
	if code != 0 || !strings.Contains(out, "resource kind: "+api.KindNames()) {
		t.Errorf("lease create -h: exit %d, no %q:\n%s", code, api.KindNames(), out)
	}
	out, _, _ = runCLI(t, "", "__complete", "lease", "create", "--kind", "")
	if got := completions(out); !slices.Equal(got, kindStrings()) {
		t.Errorf("--kind completes %q, want %q", got, kindStrings())
	}
}

// completions parses cobra's __complete answer: a word per line (then a
// TAB and its description), then :DIRECTIVE.
func completions(out string) []string {
	var words []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, ":") || l == "" {
			continue
		}
		w, _, _ := strings.Cut(l, "\t")
		words = append(words, w)
	}
	return words
}

// captureAPI answers explain and records the requests it got.
func captureAPI(t *testing.T) (*httptest.Server, func() api.LeaseRequest) {
	var mu sync.Mutex
	var last api.LeaseRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/explain":
			var req api.LeaseRequest
			json.NewDecoder(r.Body).Decode(&req)
			mu.Lock()
			last = req
			mu.Unlock()
			json.NewEncoder(w).Encode(api.Plan{State: "feasible"})
		case "/v1/nodes":
			json.NewEncoder(w).Encode([]api.Node{})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func() api.LeaseRequest { mu.Lock(); defer mu.Unlock(); return last }
}

// TestUnits: sizes and rates take units, times are durations, in what
// reaches the control plane.
func TestUnits(t *testing.T) {
	srv, last := captureAPI(t)
	for _, tc := range []struct {
		args  []string
		check func(api.LeaseRequest) bool
	}{
		{[]string{"--size", "10GiB"}, func(r api.LeaseRequest) bool { return r.Size == 10<<30 }},
		{[]string{"--size", "1.5TB"}, func(r api.LeaseRequest) bool { return r.Size == 1.5e12 }},
		{[]string{"--size", "4096"}, func(r api.LeaseRequest) bool { return r.Size == 4096 }},
		{[]string{"--bandwidth", "500MB/s"}, func(r api.LeaseRequest) bool { return r.Bandwidth == 500e6 }},
		{[]string{"--bandwidth", "500Mbit/s"}, func(r api.LeaseRequest) bool { return r.Bandwidth == 62.5e6 }},
		{[]string{"--bandwidth", "64MiB/s"}, func(r api.LeaseRequest) bool { return r.Bandwidth == 64<<20 }},
		{[]string{"--bandwidth-cap", "100MiB/s"}, func(r api.LeaseRequest) bool { return r.BandwidthCap == 100<<20 }},
		{[]string{"--bandwidth-cap", "800Mbit/s"}, func(r api.LeaseRequest) bool { return r.BandwidthCap == 100e6 }},
		{[]string{"--stripe-unit", "64KiB"}, func(r api.LeaseRequest) bool { return r.StripeUnit == 64<<10 }},
		{[]string{"--work", "150GB"}, func(r api.LeaseRequest) bool { return r.Work == 150e9 }},
		{[]string{"--deadline", "90s"}, func(r api.LeaseRequest) bool { return r.DeadlineSecond == 90 }},
		{[]string{"--deadline", "1m30s"}, func(r api.LeaseRequest) bool { return r.DeadlineSecond == 90 }},
		{[]string{"--deadline", "90"}, func(r api.LeaseRequest) bool { return r.DeadlineSecond == 90 }},
		{[]string{"--ttl", "2h"}, func(r api.LeaseRequest) bool { return r.TTLSeconds == 7200 }},
		{[]string{"--ttl", "600"}, func(r api.LeaseRequest) bool { return r.TTLSeconds == 600 }},
		{[]string{"--kind", "MEMORY"}, func(r api.LeaseRequest) bool { return r.Kind == api.KindMemory }},
	} {
		for _, verb := range [][]string{{"explain"}, {"lease", "create", "--dry-run"}} {
			args := append(append([]string{}, verb...), tc.args...)
			if _, errs, code := runCLI(t, srv.URL, args...); code != 0 {
				t.Errorf("%q: exit %d: %s", args, code, errs)
				continue
			}
			if r := last(); !tc.check(r) {
				t.Errorf("%q: sent %+v", args, r)
			}
		}
	}
}

// TestOutputFormats: -o json, yaml and template=… on verbs that print
// objects, the same fields in each.
func TestOutputFormats(t *testing.T) {
	srv := fakeAPI(t)
	caDir := filepath.Join(t.TempDir(), "tls")
	if _, err := pki.Open(caDir, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(t.TempDir(), "t.tmpl")
	if err := os.WriteFile(tmpl, []byte("{{.id}}={{.state}}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		verb []string
		id   string // of the first object
	}{
		{[]string{"nodes"}, "node-1"},
		{[]string{"devices"}, "dev-1"},
		{[]string{"leases"}, "lease-1"},
		{[]string{"lease", "show", "lease-1"}, "lease-1"},
		{[]string{"explain", "--size", "1GiB"}, "dry-run"},
		{[]string{"lease", "create", "--dry-run", "--size", "1GiB"}, "dry-run"},
		{[]string{"topology"}, "topology"},
		{[]string{"events"}, ""},
		{[]string{"version"}, "rialto"},
		{[]string{"cost"}, "plan"},
		{[]string{"sim", "list"}, ""},
		{[]string{"ca", "show", "--tls-dir", caDir}, ""},
	} {
		verb := strings.Join(tc.verb, " ")
		jout, errs, code := runCLI(t, srv.URL, append(tc.verb, "-o", "json")...)
		if code != 0 {
			t.Errorf("%s -o json: exit %d: %s", verb, code, errs)
			continue
		}
		var fromJSON any
		if err := json.Unmarshal([]byte(jout), &fromJSON); err != nil {
			t.Errorf("%s -o json: %v", verb, err)
			continue
		}
		yout, errs, code := runCLI(t, srv.URL, append(tc.verb, "-o", "yaml")...)
		var fromYAML any
		if code != 0 || yaml.Unmarshal([]byte(yout), &fromYAML) != nil {
			t.Errorf("%s -o yaml: exit %d: %s\n%s", verb, code, errs, yout)
			continue
		}
		// Block style, a field per line, not JSON's flow style on one line.
		if y := strings.TrimSpace(yout); len(y) > 2 && (y[0] == '{' || y[0] == '[' || !strings.Contains(y, "\n")) {
			t.Errorf("%s -o yaml: flow style:\n%s", verb, yout)
		}
		// The same data: compare through JSON (YAML decodes numbers as
		// ints where JSON has float64).
		a, _ := json.Marshal(fromJSON)
		b, _ := json.Marshal(fromYAML)
		var na, nb any
		json.Unmarshal(a, &na)
		json.Unmarshal(b, &nb)
		if string(mustJSON(na)) != string(mustJSON(nb)) {
			t.Errorf("%s: -o yaml differs from -o json:\n%s\n%s", verb, yout, jout)
		}
		objs, ok := fromJSON.([]any)
		if !ok {
			objs = []any{fromJSON}
		}
		var want []string
		for _, o := range objs {
			m, _ := o.(map[string]any)
			want = append(want, toString(m["id"])+"="+toString(m["state"]))
		}
		for _, o := range []string{"template={{.id}}={{.state}}", "template=@" + tmpl} {
			tout, errs, code := runCLI(t, srv.URL, append(tc.verb, "-o", o)...)
			if got := strings.Split(strings.TrimSuffix(tout, "\n"), "\n"); code != 0 || !slices.Equal(got, want) {
				t.Errorf("%s -o %s: exit %d (%s): %q, want %q", verb, o, code, errs, got, want)
			}
		}
		if tc.id != "" && !strings.HasPrefix(want[0], tc.id+"=") {
			t.Errorf("%s: first object %q, want id %s", verb, want[0], tc.id)
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func toString(v any) string {
	if v == nil {
		return "<no value>"
	}
	if s, ok := v.(string); ok {
		return s
	}
	return string(mustJSON(v))
}

// TestAtFile: "@FILE" is FILE's content wherever a flag takes content,
// as in curl; "@@TEXT" is the literal "@TEXT".
func TestAtFile(t *testing.T) {
	srv := fakeAPI(t)
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("tok\n"), 0o600)
	if out, errs, code := runCLI(t, srv.URL, "nodes", "--token", "@"+tok); code != 0 || !strings.Contains(out, "node-1") {
		t.Errorf("--token @FILE: exit %d: %s", code, errs)
	}
	// A secret itself on the command line is refused as a usage mistake
	// (exit 2), @@TEXT (literal text) included; a file that is not there
	// is an error (exit 1), not a usage mistake.
	for _, tc := range []struct {
		arg, want string
		code      int
	}{
		{"@@" + tok, "--token puts a secret on the command line", 2},
		{"tok", "--token puts a secret on the command line", 2},
		{"@" + filepath.Join(dir, "none"), "no such file", 1},
	} {
		if _, errs, code := runCLI(t, srv.URL, "nodes", "--token", tc.arg); code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("--token %s: exit %d: %s; want %d and %q", tc.arg, code, errs, tc.code, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"@@at", "@at"},
		{"@@", "@"},
		{"@" + tok, "tok\n"},
	} {
		got, err := inline(tc.in, nil)
		if err != nil || string(got) != tc.want {
			t.Errorf("inline(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := inline("@"+filepath.Join(dir, "none"), nil); err == nil {
		t.Error("inline(@missing) read something")
	}
	in := filepath.Join(dir, "inputs.json")
	out, _, _ := runCLI(t, "", "cost", "--print-inputs")
	os.WriteFile(in, []byte(out), 0o600)
	a, errs, code := runCLI(t, "", "cost", "--inputs", "@"+in, "-o", "json")
	b, _, _ := runCLI(t, "", "cost", "--inputs", in, "-o", "json")
	if code != 0 || a != b {
		t.Errorf("cost --inputs @FILE: exit %d (%s), differs from --inputs FILE", code, errs)
	}
}

// TestCostNamesItself: `rialto cost` is the calculator; `plan` still runs
// it, with a notice.
func TestCostNamesItself(t *testing.T) {
	cost, errs, code := runCLI(t, "", "cost")
	if code != 0 || errs != "" {
		t.Fatalf("cost: exit %d: %s", code, errs)
	}
	plan, errs, code := runCLI(t, "", "plan")
	if code != 0 || plan != cost || !strings.Contains(errs, `"plan" is deprecated: use rialto cost`) {
		t.Errorf("plan: exit %d, stderr %q, same output %v", code, errs, plan == cost)
	}
}

// TestExplainIsDryRun: explain and lease create --dry-run are one verb.
func TestExplainIsDryRun(t *testing.T) {
	srv := fakeAPI(t)
	for _, o := range []string{"table", "json"} {
		a, errs, code := runCLI(t, srv.URL, "explain", "--size", "1GiB", "-o", o)
		b, _, _ := runCLI(t, srv.URL, "lease", "create", "--dry-run", "--size", "1GiB", "-o", o)
		if code != 0 || a != b || !strings.Contains(a, "fewest hops") {
			t.Errorf("-o %s: explain (exit %d, %s)\n%s\ndiffers from lease create --dry-run:\n%s", o, code, errs, a, b)
		}
	}
}

// TestHelpGroups: rialto -h groups verbs by role.
func TestHelpGroups(t *testing.T) {
	out, _, code := runCLI(t, "", "-h")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	sections := map[string][]string{}
	cur := ""
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasSuffix(l, ":") && !strings.HasPrefix(l, " "):
			cur = l
		case strings.HasPrefix(l, "  ") && cur != "":
			sections[cur] = append(sections[cur], strings.Fields(l)[0])
		}
	}
	for sec, want := range map[string][]string{
		"Daemons:": {"agent", "appliance", "server", "up"},
		"Client verbs (talk to a control plane):": {"attach", "devices", "explain", "lease", "leases", "nodes"},
		"Tools:": {"characterize", "completion", "cost", "sim"},
	} {
		for _, w := range want {
			if !slices.Contains(sections[sec], w) {
				t.Errorf("%s lacks %s: %v", sec, w, sections[sec])
			}
		}
	}
	if got := sections["Daemons:"]; len(got) != 4 {
		t.Errorf("Daemons: %v", got)
	}
}

// TestFlagValueNames: the name -h shows for a flag's value (pflag takes
// the first `quoted` word of its usage) is one word, e.g. "file" or
// "URL", never a phrase lifted from the text ("--replicas rialto server").
func TestFlagValueNames(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			n++
			if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " \t") {
				t.Errorf("%s --%s: value shown as %q in -h", c.CommandPath(), f.Name, name)
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRoot(&env{stdout: new(strings.Builder), stderr: new(strings.Builder), getenv: func(string) string { return "" }}))
	if n < 100 {
		t.Fatalf("only %d flags visited", n)
	}
}

// TestAddrEverywhere: every verb that talks to a control plane, and the
// agent and appliance, take --addr (default RIALTO_ADDR); the agent's
// old --control-plane is gone from its help.
func TestAddrEverywhere(t *testing.T) {
	e := &env{stdout: &strings.Builder{}, stderr: &strings.Builder{}, getenv: func(k string) string {
		if k == "RIALTO_ADDR" {
			return "https://cp.example:7070"
		}
		return ""
	}}
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		for _, s := range c.Commands() {
			walk(s)
		}
		if c.HasSubCommands() || !c.Runnable() || c.Hidden {
			return
		}
		client := c.Flags().Lookup("token") != nil && c.Parent().Name() != "server" && c.Name() != "server"
		if client || c.Name() == "agent" || c.Name() == "appliance" {
			n++
			f := c.Flags().Lookup("addr")
			if f == nil || f.DefValue != "https://cp.example:7070" {
				t.Errorf("%s: no --addr defaulting to RIALTO_ADDR", c.CommandPath())
			}
		}
	}
	walk(newRoot(e))
	if n < 20 {
		t.Errorf("only %d client verbs", n)
	}
	out, _, _ := runCLI(t, "", "agent", "-h")
	if !strings.Contains(out, "--addr URL") || strings.Contains(out, "--control-plane") {
		t.Errorf("agent -h:\n%s", out)
	}
}

// TestCompletion: `rialto completion bash|zsh|fish` prints a script for
// each shell that completes verbs and flags: the scripts ask the binary
// (rialto __complete), which answers from the command tree; where the
// shell is installed, the script is loaded and run in it.
func TestCompletion(t *testing.T) {
	markers := map[string]string{
		"bash": "complete -o default -F __start_rialto rialto",
		"zsh":  "#compdef rialto",
		"fish": "complete -c rialto",
	}
	for sh, marker := range markers {
		out, errs, code := runCLI(t, "", "completion", sh)
		if code != 0 || !strings.Contains(out, marker) || !strings.Contains(out, "__complete") {
			t.Errorf("completion %s: exit %d (%s), no %q", sh, code, errs, marker)
		}
	}
	for _, tc := range []struct {
		line []string
		want []string
	}{
		{[]string{""}, []string{"agent", "attach", "cost", "explain", "lease", "leases", "server", "sim", "up"}},
		{[]string{"lea"}, []string{"lease", "leases"}},
		{[]string{"lease", ""}, []string{"create", "move", "release", "renew", "show"}},
		{[]string{"lease", "create", "--"}, []string{"--addr", "--size", "--kind", "--bandwidth", "--deadline", "--dry-run", "--output"}},
		{[]string{"lease", "create", "--mode", ""}, []string{"dedicated", "shared", "composed"}},
		{[]string{"nodes", "-o", ""}, []string{"table", "json", "yaml", "template="}},
		{[]string{"agent", "--"}, []string{"--addr", "--bootstrap-token", "--memory"}},
	} {
		out, _, _ := runCLI(t, "", append([]string{"__complete"}, tc.line...)...)
		got := completions(out)
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("complete %q: no %s in %q", tc.line, w, got)
			}
		}
	}
	if testing.Short() {
		return
	}
	bin := buildBinary(t)
	dir := filepath.Dir(bin)
	path := dir + string(os.PathListSeparator) + os.Getenv("PATH")
	shells := map[string]string{
		// Each prints the candidates for "rialto lease cr" and
		// "rialto lease create --si".
		"bash": `source /usr/share/bash-completion/bash_completion 2>/dev/null
source <(rialto completion bash)
for line in "rialto lease cr" "rialto lease create --si"; do
  read -ra COMP_WORDS <<<"$line"; COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMP_LINE=$line; COMP_POINT=${#line}
  __start_rialto; printf '%s\n' "${COMPREPLY[@]}"
done`,
		"fish": `rialto completion fish | source
complete -C 'rialto lease cr'; complete -C 'rialto lease create --si'`,
		// zsh completes in its line editor only: an interactive zsh in a
		// pseudo-terminal (zsh/zpty) is sent the lines and a TAB each.
		"zsh": `zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z 'PS1="> "; autoload -U compinit; compinit -u; source <(rialto completion zsh); echo READY'
zpty -r -m z out '*READY*'
zpty -n -w z $'rialto lease cr\t'
zpty -r -m z out '*create*' && print -r -- "$out"
zpty -n -w z $'\x15rialto lease create --si\t'
zpty -r -m z out '*--size*' && print -r -- "$out"
zpty -d z`,
	}
	for sh, script := range shells {
		if _, err := exec.LookPath(sh); err != nil {
			t.Logf("%s not installed: its script checked as text only", sh)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, sh, "-c", script)
		cmd.Env = append(os.Environ(), "PATH="+path)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "create") || !strings.Contains(string(out), "--size") {
			t.Errorf("%s completion: %v\n%s", sh, err, out)
		}
	}
}

// TestProgressOnlyOnTerminals: the progress bar is off when stderr is a
// pipe, a file or a buffer (logs keep their lines).
func TestProgressOnlyOnTerminals(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, e := range []*env{{stderr: w}, {stderr: f}, {stderr: &strings.Builder{}}} {
		if p := newProgress(e, 3, "x"); p != nil {
			t.Errorf("a bar on %T", e.stderr)
		}
	}
	var p *progress // off: its methods do nothing
	p.step("x")
	p.done()
}

// TestUnitsAgentNIC: an agent's lent NIC rate takes tc's syntax and the
// CLI's rates alike.
func TestUnitsAgentNIC(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64 // bytes/s; < 0: refused
	}{
		{"n=lo:1gbit", 125e6},
		{"n=lo:400mbit", 50e6},
		{"n=lo:500MB/s", 500e6},
		{"n=lo:1Gbit/s", 125e6},
		{"n=lo:fast", -1},
	} {
		d, err := parseNIC(tc.in)
		switch {
		case tc.want < 0 && err == nil:
			t.Errorf("%q accepted: %d", tc.in, d.Size)
		case tc.want >= 0 && (err != nil || d.Size != tc.want):
			t.Errorf("%q: %d, %v; want %d", tc.in, d.Size, err, tc.want)
		}
	}
}

// TestSecretAtFileIsTheFileFlag: --token @FILE is --token-file FILE, the
// flag a server's SIGHUP reads again (config.go).
func TestSecretAtFileIsTheFileFlag(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	s := secretFile(fs, &env{getenv: func(string) string { return "" }}, "token", "RIALTO_TOKEN", "the API token")
	if err := fs.Parse([]string{"--token", "@/etc/rialto/token"}); err != nil {
		t.Fatal(err)
	}
	if !fs.Changed("token-file") || fs.Lookup("token-file").Value.String() != "/etc/rialto/token" || s.file != "/etc/rialto/token" || s.refused {
		t.Errorf("--token @FILE: token-file changed %v, %+v", fs.Changed("token-file"), s)
	}
}

// TestGroupSummariesNameTheirVerbs: the summary `rialto -h` shows for a
// two-word verb's first word ("node") names each of its verbs ("node
// remove" too), so that none is found only by reading `rialto node -h`.
func TestGroupSummariesNameTheirVerbs(t *testing.T) {
	for name := range commands {
		group, verb, ok := strings.Cut(name, " ")
		if !ok {
			continue
		}
		sum, ok := groupSummaries[group]
		if !ok {
			t.Errorf("%q: no summary for %q", name, group)
			continue
		}
		words := strings.ToLower(sum)
		if !strings.Contains(words, strings.ReplaceAll(verb, "-", " ")) && !strings.Contains(words, verb) {
			t.Errorf("the summary of %q (%q) does not name %q", group, sum, verb)
		}
	}
}
