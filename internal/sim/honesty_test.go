package sim

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// ownNoFigures are the experiments TestPredictionsIgnoreTheirFigures does
// not rerun: Rialto's own, with no paper figure to compare with (the test
// checks that they stay so), and too large (scale) or needing the traces
// (gpu-openb) for a test that runs every experiment twice.
var ownNoFigures = []string{"scale", "gpu-openb"}

// TestPredictionsIgnoreTheirFigures: no model reads a figure that no
// calibration lists. Every such figure (the ones experiments may compare
// predictions with) is moved, each by its own factor, and every experiment
// is run again: every metric's value and every row of its table must be
// what it was. A model that read its own target — a threshold copied from
// the paper, a constant derived from the figure it is then compared with —
// changes with it and fails here; the figures a model may read are those a
// calibration lists, and check then refuses to call them predicted.
func TestPredictionsIgnoreTheirFigures(t *testing.T) {
	var free []string
	for _, f := range Figures {
		if len(Fitted(f.ID)) == 0 {
			free = append(free, f.ID)
		}
	}
	if len(free) == 0 {
		t.Fatal("every figure is a calibration's: nothing is predicted")
	}
	runAll := func() map[string]Result {
		out := map[string]Result{}
		for _, x := range Experiments() {
			if slices.Contains(ownNoFigures, x.Name) {
				if x.Paper != "" {
					t.Errorf("%s follows a paper but is not rerun", x.Name)
				}
				continue
			}
			r, err := Run(context.Background(), x.Name, Options{})
			if err != nil {
				t.Fatalf("%s: %v", x.Name, err)
			}
			out[x.Name] = r
		}
		return out
	}
	before := runAll()
	saved := map[string]Figure{}
	for i, id := range free {
		f := figureIndex[id]
		saved[id] = f
		f.Value *= 1.37 + 0.01*float64(i)
		figureIndex[id] = f
	}
	defer func() {
		for id, f := range saved {
			figureIndex[id] = f
		}
	}()
	after := runAll()
	compared := 0
	for name, a := range before {
		b := after[name]
		if string(a.CSV()) != string(b.CSV()) {
			t.Errorf("%s: its table changed when figures no calibration lists moved: a model reads one of %v", name, free)
		}
		for i, m := range a.Metrics {
			if m.Kind == Prediction && m.Figure != "" {
				compared++
			}
			if i >= len(b.Metrics) || b.Metrics[i].Name != m.Name {
				t.Errorf("%s: metrics changed", name)
				break
			}
			if v := b.Metrics[i].Value; v != m.Value {
				t.Errorf("%s: %q (%s) went from %v to %v when figures no calibration lists moved: its model reads one of %v", name, m.Name, m.Kind, m.Value, v, free)
			}
		}
	}
	if compared == 0 {
		t.Error("no prediction is compared with a paper figure")
	}
}

// figReaders are the functions through which code reads a paper figure by
// its ID.
var figReaders = map[string]bool{"fig": true, "fig0": true, "FigureByID": true}

// TestNoPackageLevelFigureReads: a figure read while the package
// initialises (a package-level variable such as CallNVMe or DefaultSmufin
// built from figures) is a model input the rerun of
// TestPredictionsIgnoreTheirFigures cannot move, so it must be one a
// calibration lists (and so can never be called predicted).
func TestNoPackageLevelFigureReads(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	reads := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			ast.Inspect(g, func(n ast.Node) bool {
				id := ""
				switch n := n.(type) {
				case *ast.CallExpr:
					if fn, ok := n.Fun.(*ast.Ident); ok && figReaders[fn.Name] && len(n.Args) == 1 {
						id = literal(n.Args[0])
						if id == "" {
							t.Errorf("%s: %s(...) at package level with a computed ID", fset.Position(n.Pos()), fn.Name)
						}
					}
				case *ast.IndexExpr:
					if x, ok := n.X.(*ast.Ident); ok && x.Name == "figureIndex" {
						id = literal(n.Index)
					}
				}
				if id == "" {
					return true
				}
				reads++
				if _, ok := FigureByID(id); !ok {
					t.Errorf("%s: reads unknown figure %q", fset.Position(n.Pos()), id)
				} else if len(Fitted(id)) == 0 {
					t.Errorf("%s: a package-level variable is built from %q, which no calibration lists: a model input hidden from the registry (list it in the calibration that uses it, which makes it a fit)", fset.Position(n.Pos()), id)
				}
				return true
			})
		}
	}
	if reads == 0 {
		t.Error("found no package-level figure read (CallNVMe reads three): the scan is broken")
	}
}

func literal(e ast.Expr) string {
	if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
		s, err := strconv.Unquote(b.Value)
		if err == nil {
			return s
		}
	}
	return ""
}
