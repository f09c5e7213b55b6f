package lifecycle

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPurity keeps the state machine pure: no I/O, network, database,
// logging, concurrency or randomness packages, no goroutines and no wall
// clock (time values are fine; time.Now and friends are not). The caller
// performs the actions; Step only decides them.
func TestPurity(t *testing.T) {
	banned := map[string]bool{
		"os": true, "os/exec": true, "os/signal": true, "net": true, "net/http": true, "net/netip": true,
		"io": true, "io/fs": true, "bufio": true, "database/sql": true, "log": true, "log/slog": true,
		"syscall": true, "unsafe": true, "sync": true, "sync/atomic": true, "context": true, "runtime": true,
		"math/rand": true, "math/rand/v2": true, "crypto/rand": true, "embed": true, "plugin": true,
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
			if banned[p] || (strings.HasPrefix(p, "net/") && p != "net/url") ||
				(strings.HasPrefix(p, "github.com/rialto-project/rialto/internal/") && p != "github.com/rialto-project/rialto/internal/controlplane/store") {
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
}
