package sim

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPurity keeps the simulator's core pure: no network, processes,
// namespaces, files, goroutines or wall clock in package sim (traces come in
// through an fs.FS the caller opens; the real counterparts live in
// internal/lab, which imports sim, never the other way round).
func TestPurity(t *testing.T) {
	banned := map[string]bool{
		"os": true, "os/exec": true, "os/signal": true, "net": true, "syscall": true, "unsafe": true,
		"sync": true, "sync/atomic": true, "runtime": true, "log": true, "log/slog": true, "database/sql": true,
		"crypto/rand": true, "embed": true, "plugin": true,
	}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
		"AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		n++
		fs := token.NewFileSet()
		af, err := parser.ParseFile(fs, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		timeName := ""
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if banned[p] || strings.HasPrefix(p, "net/") || strings.Contains(p, "/internal/") &&
				!strings.HasSuffix(p, "/internal/placement") && !strings.HasSuffix(p, "/internal/fabric") {
				t.Errorf("%s imports %s", f, p)
			}
			if p == "time" {
				timeName = "time"
				if im.Name != nil {
					timeName = im.Name.Name
				}
			}
		}
		ast.Inspect(af, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement at %v", f, fs.Position(n.Pos()))
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && timeName != "" && id.Name == timeName && clock[n.Sel.Name] {
					t.Errorf("%s: time.%s at %v", f, n.Sel.Name, fs.Position(n.Pos()))
				}
			}
			return true
		})
	}
	if n == 0 {
		t.Fatal("no source files")
	}
	// The whole dependency graph, too: nothing the core links in may reach
	// the network, processes or namespaces.
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool absent:", err)
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "net" || strings.HasPrefix(p, "net/") || p == "os/exec" || strings.Contains(p, "internal/netns") ||
			strings.Contains(p, "internal/lab") || strings.Contains(p, "dataplane") || strings.Contains(p, "controlplane") {
			t.Errorf("package sim depends on %s", p)
		}
	}
}
