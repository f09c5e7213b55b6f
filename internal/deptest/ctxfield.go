package deptest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
)

// StoredContexts lists the struct fields of a Go source file whose type
// is context.Context ("file:line: field name", "embedded" for an embedded
// one), under whatever name the file imports "context" as: the rule that
// ctx is passed, never stored (docs/CONTRIBUTING.md). A file that does not
// parse is an error.
func StoredContexts(filename string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	name := ""
	for _, im := range f.Imports {
		if p, _ := strconv.Unquote(im.Path.Value); p == "context" {
			name = "context"
			if im.Name != nil {
				name = im.Name.Name
			}
		}
	}
	if name == "" || name == "_" {
		return nil, nil
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		st, ok := n.(*ast.StructType)
		if !ok {
			return true
		}
		for _, fld := range st.Fields.List {
			if !isContext(fld.Type, name) {
				continue
			}
			names := []string{"embedded"}
			if len(fld.Names) > 0 {
				names = names[:0]
				for _, id := range fld.Names {
					names = append(names, id.Name)
				}
			}
			for _, nm := range names {
				out = append(out, fmt.Sprintf("%s:%d: %s", filename, fset.Position(fld.Pos()).Line, nm))
			}
		}
		return true
	})
	return out, nil
}

// isContext reports whether e is pkg.Context, or a pointer to it.
func isContext(e ast.Expr, pkg string) bool {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Context" {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}
