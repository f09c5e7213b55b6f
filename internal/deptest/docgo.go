package deptest

import (
	"fmt"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
)

// DocProblems lists what breaks the rule "every package has a doc.go"
// (docs/CONTRIBUTING.md) in the package whose directory is dir: doc.go is
// missing or carries no package comment, or another non-test file carries
// one too (the comment lives in one place). A directory with no non-test Go
// file is an error.
func DocProblems(dir string) ([]string, error) {
	var out []string
	docGo := false
	fset := token.NewFileSet()
	err := eachSource(dir, func(f string, src []byte) error {
		af, err := parser.ParseFile(fset, f, src, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		hasDoc := af.Doc != nil && strings.TrimSpace(af.Doc.Text()) != ""
		switch {
		case filepath.Base(f) == "doc.go":
			docGo = true
			if !hasDoc {
				out = append(out, fmt.Sprintf("%s has no package comment", f))
			}
		case hasDoc:
			out = append(out, fmt.Sprintf("%s carries a package comment: move it to doc.go", f))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !docGo {
		out = append(out, fmt.Sprintf("%s has no doc.go (purpose, zero value, concurrency contract)", dir))
	}
	return out, nil
}
