package deptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// own is an import path in the module.
func own(rel string) string { return Module + "/" + rel }

// pkg is a synthetic package: imports are direct, deps the rest of the
// closure (Deps lists both, as go list does).
func pkg(path string, imports []string, deps ...string) Package {
	all := append(slices.Clone(imports), deps...)
	slices.Sort(all)
	return Package{ImportPath: path, Imports: imports, Deps: all}
}

// TestRules shows each rule catching a forbidden import, directly and
// through another package, and letting clean packages (and the packages
// it does not cover) through.
func TestRules(t *testing.T) {
	stdDeps := []string{"errors", "internal/abi", "os", "runtime", "sync", "syscall", "unsafe"} // what fmt and time pull in
	for _, c := range []struct {
		name string
		pkg  Package
		want []string // Violation.String()s, in order; none for a clean package
	}{
		{"placement clean", pkg(own("internal/placement"), []string{"fmt", "math", "time", own("internal/fabric")}, stdDeps...), nil},
		{"placement imports net/http", pkg(own("internal/placement"), []string{"fmt", "net/http"}, "net"),
			[]string{"pure policies reach no I/O: " + own("internal/placement") + " imports net/http",
				"pure policies reach no I/O: " + own("internal/placement") + " depends on net"}},
		{"fabric imports os", pkg(own("internal/fabric"), []string{"os", "sort"}, stdDeps...),
			[]string{"pure policies reach no I/O: " + own("internal/fabric") + " imports os"}},
		{"resource imports syscall", pkg(own("internal/resource"), []string{"syscall"}),
			[]string{"pure policies reach no I/O: " + own("internal/resource") + " imports syscall"}},
		{"sim reaches os/exec through a helper", pkg(own("internal/sim"), []string{own("internal/sim/helper")}, "os/exec"),
			[]string{"pure policies reach no I/O: " + own("internal/sim") + " depends on os/exec"}},
		{"sim workload imports database/sql", pkg(own("internal/sim/workload"), []string{"database/sql"}),
			[]string{"pure policies reach no I/O: " + own("internal/sim/workload") + " imports database/sql"}},
		{"placement reaches the agent through fabric", pkg(own("internal/placement"), []string{own("internal/fabric")}, own("internal/agent")),
			[]string{"pure policies reach no server, agent or data plane: " + own("internal/placement") + " depends on " + own("internal/agent")}},
		{"sim imports the memory data plane", pkg(own("internal/sim"), []string{own("internal/dataplane/memory")}),
			[]string{"pure policies reach no server, agent or data plane: " + own("internal/sim") + " imports " + own("internal/dataplane/memory")}},
		{"sim imports the lab", pkg(own("internal/sim"), []string{own("internal/lab")}),
			[]string{"pure policies reach no server, agent or data plane: " + own("internal/sim") + " imports " + own("internal/lab")}},
		{"sim imports the control plane", pkg(own("internal/sim"), []string{own("internal/controlplane")}),
			[]string{"pure policies reach no server, agent or data plane: " + own("internal/sim") + " imports " + own("internal/controlplane"),
				"the simulator never reaches the control plane: " + own("internal/sim") + " imports " + own("internal/controlplane")}},
		{"the lab may use namespaces and data planes", pkg(own("internal/lab"),
			[]string{"net", "os/exec", own("internal/netns"), own("internal/dataplane/block/nbd"), own("internal/sim")}, stdDeps...), nil},
		{"the lab reaches the control plane", pkg(own("internal/lab"), []string{"net"}, own("internal/controlplane/store")),
			[]string{"the simulator never reaches the control plane: " + own("internal/lab") + " depends on " + own("internal/controlplane/store")}},
		{"the lab imports the control plane", pkg(own("internal/lab"), []string{own("internal/controlplane/httpapi")}),
			[]string{"the simulator never reaches the control plane: " + own("internal/lab") + " imports " + own("internal/controlplane/httpapi")}},
		{"a lab under internal/sim is the simulator's core: no namespaces", pkg(own("internal/sim/validate"), []string{"net", own("internal/netns")}),
			[]string{"pure policies reach no I/O: " + own("internal/sim/validate") + " imports net",
				"pure policies reach no server, agent or data plane: " + own("internal/sim/validate") + " imports " + own("internal/netns")}},
		{"the report writer writes files", pkg(own("internal/sim/report"), []string{"os", "path/filepath", own("internal/sim")}, stdDeps...), nil},
		{"api clean", pkg(own("api"), []string{"net/http", "encoding/json"}, stdDeps...), nil},
		{"api imports internal/resource", pkg(own("api"), []string{"net/http", own("internal/resource")}),
			[]string{"api reaches nothing under internal/: " + own("api") + " imports " + own("internal/resource")}},
		{"data plane clean", pkg(own("internal/dataplane/accel/gateway"), []string{"net/http", own("internal/httpx"), own("internal/dataplane/accel")}, "net", "syscall"), nil},
		{"accel data plane imports api", pkg(own("internal/dataplane/accel"), []string{"net/http", own("api")}),
			[]string{"data planes reach neither api nor the control plane: " + own("internal/dataplane/accel") + " imports " + own("api")}},
		{"block data plane reaches the control plane", pkg(own("internal/dataplane/block/nbd"), []string{"net"}, own("internal/controlplane")),
			[]string{"data planes reach neither api nor the control plane: " + own("internal/dataplane/block/nbd") + " depends on " + own("internal/controlplane")}},
		{"memory data plane imports the agent", pkg(own("internal/dataplane/memory"), []string{own("internal/agent")}),
			[]string{"data planes reach neither api nor the control plane: " + own("internal/dataplane/memory") + " imports " + own("internal/agent")}},
		{"the control plane may import anything", pkg(own("internal/controlplane"), []string{"database/sql", own("api"), own("internal/placement")}), nil},
		{"the binary reaches a test helper", pkg(own("cmd/rialto"), []string{own("internal/dataplane/block/nbd/nbdtest")}, "testing"),
			[]string{"the rialto binary reaches no test code: " + own("cmd/rialto") + " depends on testing"}},
		{"a test helper may use testing", pkg(own("internal/dataplane/block/nbd/nbdtest"), []string{"testing", own("internal/dataplane/block/nbd")}), nil},
		{"a package of the same prefix is not the package", pkg(own("internal/placementtool"), []string{"net/http"}), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, v := range Check([]Package{c.pkg}, Rules) {
				got = append(got, v.String())
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("violations:\n  got  %q\n  want %q", got, c.want)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"net", "net", true},
		{"net", "net/http", false},
		{"net/...", "net", true},
		{"net/...", "net/http/httptest", true},
		{"net/...", "netip", false},
		{"./internal/sim/...", own("internal/sim"), true},
		{"./internal/sim/...", own("internal/sim/report"), true},
		{"./internal/sim/...", own("internal/simx"), false},
		{"./api", own("api"), true},
		{"./api", "api", false},
	} {
		if got := Match(c.pattern, c.path); got != c.want {
			t.Errorf("Match(%q, %q) = %v", c.pattern, c.path, got)
		}
	}
}

func TestVacuous(t *testing.T) {
	pkgs := []Package{{ImportPath: own("internal/placement")}, {ImportPath: own("api")}}
	rules := []Rule{
		{Name: "placement", Packages: []string{"./internal/placement/..."}},
		{Name: "misspelt", Packages: []string{"./internal/plcement/..."}},
		{Name: "all excepted", Packages: []string{"./api"}, Except: []string{"./api/..."}},
	}
	if got := Vacuous(pkgs, rules); !slices.Equal(got, []string{"misspelt", "all excepted"}) {
		t.Errorf("Vacuous = %q", got)
	}
}

// goList loads the module's packages as `go list -json` reports them,
// with overlay (file path → content; nil for none) laid over the tree.
func goList(t *testing.T, overlay map[string]string) []Package {
	t.Helper()
	root := moduleRoot(t)
	args := []string{"list", "-e", "-json=ImportPath,Imports,Deps,Error,DepsErrors"}
	if overlay != nil {
		dir := t.TempDir()
		replace := map[string]string{}
		for name, content := range overlay {
			f := filepath.Join(dir, strings.ReplaceAll(name, "/", "_"))
			if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			replace[filepath.Join(root, name)] = f
		}
		b, err := json.Marshal(map[string]any{"Replace": replace})
		if err != nil {
			t.Fatal(err)
		}
		ov := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(ov, b, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-overlay", ov)
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Package
			Error *struct{ Err string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p.Package)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	return pkgs
}

func moduleRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("not in a module")
	}
	return filepath.Dir(gomod)
}

// TestRepository checks the module as it is: no rule is broken, and every
// rule applies to some package.
func TestRepository(t *testing.T) {
	pkgs := goList(t, nil)
	for _, v := range Check(pkgs, Rules) {
		t.Error(v)
	}
	for _, name := range Vacuous(pkgs, Rules) {
		t.Errorf("rule %q applies to no package", name)
	}
}

// TestRepositoryCatchesAddedImport adds forbidden imports to the real
// tree (through go list's -overlay, so nothing on disk changes) and
// expects the check to name each.
func TestRepositoryCatchesAddedImport(t *testing.T) {
	pkgs := goList(t, map[string]string{
		"internal/placement/zz_forbidden.go":       "package placement\n\nimport _ \"net/http\"\n",
		"internal/dataplane/accel/zz_forbidden.go": "package accel\n\nimport _ \"github.com/rialto-project/rialto/api\"\n",
		"internal/sim/zz_forbidden.go":             "package sim\n\nimport _ \"github.com/rialto-project/rialto/internal/controlplane/lifecycle\"\n",
		"api/zz_forbidden.go":                      "package api\n\nimport _ \"github.com/rialto-project/rialto/internal/resource\"\n",
	})
	var got []string
	for _, v := range Check(pkgs, Rules) {
		if v.Direct {
			got = append(got, v.String())
		}
	}
	for _, want := range []string{
		"pure policies reach no I/O: " + own("internal/placement") + " imports net/http",
		"data planes reach neither api nor the control plane: " + own("internal/dataplane/accel") + " imports " + own("api"),
		"the simulator never reaches the control plane: " + own("internal/sim") + " imports " + own("internal/controlplane/lifecycle"),
		"api reaches nothing under internal/: " + own("api") + " imports " + own("internal/resource"),
	} {
		if !slices.Contains(got, want) {
			t.Errorf("not caught: %s\n(caught: %q)", want, got)
		}
	}
}
