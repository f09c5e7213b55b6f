package deptest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// wallClock are the functions of package time that read or wait on the
// wall clock; time values and durations are fine in a pure package.
var wallClock = map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
	"AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true}

// Impurities lists what makes a Go source file impure ("file:line: what"):
// each import for which forbid returns true (forbid may be nil), each go
// statement and each call of the wall clock (time.Now, time.Sleep, …) under
// whatever name the file imports "time" as. A pure policy's package test
// runs it over its own files, with its own import policy; the import rules
// between packages are Rules. A file that does not parse is an error.
func Impurities(filename string, src []byte, forbid func(importPath string) bool) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []string
	timeName := ""
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		if forbid != nil && forbid(p) {
			out = append(out, fmt.Sprintf("%s: imports %s", fset.Position(im.Pos()), p))
		}
		if p == "time" {
			timeName = "time"
			if im.Name != nil {
				timeName = im.Name.Name
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			out = append(out, fmt.Sprintf("%s: go statement", fset.Position(n.Pos())))
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && timeName != "" && id.Name == timeName && wallClock[n.Sel.Name] {
				out = append(out, fmt.Sprintf("%s: time.%s", fset.Position(n.Pos()), n.Sel.Name))
			}
		}
		return true
	})
	return out, nil
}

// ImpuritiesIn runs Impurities over the non-test Go files of dir. A
// directory with no such file is an error, so a moved package cannot make
// its purity test pass vacuously.
func ImpuritiesIn(dir string, forbid func(importPath string) bool) ([]string, error) {
	var out []string
	err := eachSource(dir, func(f string, src []byte) error {
		bad, err := Impurities(f, src, forbid)
		out = append(out, bad...)
		return err
	})
	return out, err
}

// eachSource calls fn with the name and contents of each non-test Go file
// of dir, in name order, and stops at its first error. A directory with no
// such file is an error.
func eachSource(dir string, fn func(name string, src []byte) error) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return err
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		n++
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := fn(f, src); err != nil {
			return err
		}
	}
	if n == 0 {
		return fmt.Errorf("deptest: no Go source files in %s", dir)
	}
	return nil
}
