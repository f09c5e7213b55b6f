package deptest

import (
	"fmt"
	"slices"
	"strings"
)

// Module is the module's path; patterns below are relative to it.
const Module = "github.com/rialto-project/rialto"

// Package is what Check needs of a package: what `go list -json` reports
// as ImportPath, Imports (direct) and Deps (transitive).
type Package struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// Rule forbids packages some imports. A pattern is an import path
// ("net/http"), or one ending in "/..." that also matches every path below
// it ("net/..." matches net and net/http); a pattern starting with "./" is
// relative to Module ("./internal/sim/...").
type Rule struct {
	Name     string   // what the rule keeps, for messages
	Packages []string // the packages it applies to
	Except   []string // packages it does not apply to, although Packages match them
	NoImport []string // what they must not import directly
	NoDep    []string // what they must not depend on, directly or not
}

// Violation is one forbidden dependency.
type Violation struct {
	Rule    string
	Package string
	Dep     string
	Direct  bool
}

func (v Violation) String() string {
	how := "depends on"
	if v.Direct {
		how = "imports"
	}
	return fmt.Sprintf("%s: %s %s %s", v.Rule, v.Package, how, v.Dep)
}

// Rules are the repository's dependency rules (docs/CONTRIBUTING.md).
//
// The lab, which runs the simulator's predictions against real data planes
// in network namespaces, is internal/lab, outside the pure policies.
//
// The lease state machine (internal/controlplane/lifecycle) is pure too,
// but not one of these: it takes api's types and the store's, and api
// reaches net/http through its client. Its own TestPurity keeps its
// imports to api, the store's types and net/url, and its code free of
// goroutines and of the wall clock.
var Rules = []Rule{
	{
		Name:     "pure policies reach no I/O",
		Packages: pure,
		Except:   writers,
		NoDep: []string{
			"net", "net/...", "os/exec", "os/signal", "database/...", "plugin",
			"golang.org/x/sys/...",
		},
		// fmt and time reach os and syscall, so these hold for direct
		// imports only.
		NoImport: []string{"os", "syscall", "io/ioutil", "unsafe"},
	},
	{
		Name:     "pure policies reach no server, agent or data plane",
		Packages: pure,
		Except:   writers,
		NoDep: []string{
			"./internal/controlplane/...", "./internal/agent/...", "./internal/dataplane/...",
			"./internal/netns/...", "./internal/rack/...", "./internal/lab/...",
			"./internal/testcluster/...", "./internal/httpx/...", "./api/...", "./cmd/...",
		},
	},
	{
		Name:     "the simulator never reaches the control plane",
		Packages: []string{"./internal/sim/...", "./internal/lab/..."},
		NoDep:    []string{"./internal/controlplane/...", "./cmd/..."},
	},
	{
		Name:     "api reaches nothing under internal/",
		Packages: []string{"./api/..."},
		NoDep:    []string{"./internal/...", "./cmd/..."},
	},
	{
		Name:     "data planes reach neither api nor the control plane",
		Packages: []string{"./internal/dataplane/..."},
		NoDep:    []string{"./api/...", "./internal/controlplane/...", "./internal/agent/...", "./cmd/..."},
	},
	{
		// The test helpers (nbdtest, nbdkittest, storetest, …) take a
		// testing.TB; none of them, nor the testing package, belongs
		// in what users run.
		Name:     "the rialto binary reaches no test code",
		Packages: []string{"./cmd/rialto"},
		NoDep:    []string{"testing", "testing/..."},
	},
}

var (
	// pure are the policies: placement, fabric, resource, the SVG text
	// metrics the plots share (svgtext), and the
	// simulator's core (internal/sim and below, but for the report writer,
	// which writes files).
	pure    = []string{"./internal/placement/...", "./internal/fabric/...", "./internal/resource/...", "./internal/sim/...", "./internal/svgtext/..."}
	writers = []string{"./internal/sim/report/..."}
)

// Match reports whether import path p matches pattern.
func Match(pattern, p string) bool {
	if rel, ok := strings.CutPrefix(pattern, "./"); ok {
		pattern = Module + "/" + rel
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == base || strings.HasPrefix(p, base+"/")
	}
	return p == pattern
}

func matchAny(patterns []string, p string) bool {
	for _, pat := range patterns {
		if Match(pat, p) {
			return true
		}
	}
	return false
}

// applies reports whether r applies to package p.
func (r *Rule) applies(p string) bool {
	return matchAny(r.Packages, p) && !matchAny(r.Except, p)
}

// Check applies rules to pkgs and returns every violation, in package
// order, then rule order, then dependency order.
func Check(pkgs []Package, rules []Rule) []Violation {
	var out []Violation
	for _, p := range pkgs {
		for i := range rules {
			r := &rules[i]
			if !r.applies(p.ImportPath) {
				continue
			}
			for _, d := range p.Imports {
				if matchAny(r.NoImport, d) || matchAny(r.NoDep, d) {
					out = append(out, Violation{Rule: r.Name, Package: p.ImportPath, Dep: d, Direct: true})
				}
			}
			for _, d := range p.Deps {
				if matchAny(r.NoDep, d) && !slices.Contains(p.Imports, d) {
					out = append(out, Violation{Rule: r.Name, Package: p.ImportPath, Dep: d})
				}
			}
		}
	}
	return out
}

// Vacuous names the rules that apply to none of pkgs: a misspelt pattern,
// or a package moved away, would otherwise leave a rule checking nothing.
func Vacuous(pkgs []Package, rules []Rule) []string {
	var out []string
	for i := range rules {
		n := 0
		for _, p := range pkgs {
			if rules[i].applies(p.ImportPath) {
				n++
			}
		}
		if n == 0 {
			out = append(out, rules[i].Name)
		}
	}
	return out
}
