package deptest

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestStoredContexts(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"named field", "package p\nimport \"context\"\ntype T struct {\n\tn int\n\tctx context.Context\n}", []string{"f.go:5: ctx"}},
		{"two names, one line", "package p\nimport \"context\"\ntype T struct{ a, b context.Context }", []string{"f.go:3: a", "f.go:3: b"}},
		{"embedded", "package p\nimport \"context\"\ntype T struct {\n\tcontext.Context\n}", []string{"f.go:4: embedded"}},
		{"pointer", "package p\nimport \"context\"\ntype T struct{ c *context.Context }", []string{"f.go:3: c"}},
		{"renamed import", "package p\nimport stdctx \"context\"\ntype T struct{ c stdctx.Context }", []string{"f.go:3: c"}},
		{"anonymous struct in a func", "package p\nimport \"context\"\nfunc f() {\n\tv := struct{ c context.Context }{}\n\t_ = v\n}", []string{"f.go:4: c"}},
		{"a test table's field", "package p\nimport \"context\"\nvar cases = []struct {\n\tname string\n\tctx  context.Context\n}{}", []string{"f.go:5: ctx"}},
		{"parameters and results are fine", "package p\nimport \"context\"\nfunc f(ctx context.Context) context.Context { return ctx }\ntype I interface{ Session() (context.Context, error) }", nil},
		{"a cancel function is fine", "package p\nimport \"context\"\ntype T struct{ cancel context.CancelFunc; done <-chan struct{} }", nil},
		{"another package named context", "package p\nimport \"other/context\"\ntype T struct{ c context.Context }", nil},
		{"no context import", "package p\ntype T struct{ c context.Context }", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := StoredContexts("f.go", []byte(c.src))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
	if _, err := StoredContexts("bad.go", []byte("package")); err == nil {
		t.Error("a file that does not parse gave no error")
	}
}

// TestRepositoryStoresNoContext: no struct of the module, tests included,
// keeps a context.Context.
func TestRepositoryStoresNoContext(t *testing.T) {
	root := moduleRoot(t)
	n := 0
	eachGoFile(t, root, true, func(rel string, src []byte) error {
		found, err := StoredContexts(rel, src)
		if err != nil {
			return err
		}
		n++
		for _, f := range found {
			t.Errorf("%s keeps a context.Context: pass ctx to what blocks instead (docs/CONTRIBUTING.md)", f)
		}
		return nil
	})
	if n < 100 {
		t.Fatalf("only %d Go files checked under %s", n, root)
	}
}

// eachGoFile calls f with the path (relative to root) and contents of
// every Go file under root, test files too if tests, skipping hidden,
// testdata and vendor directories; an error from f or the walk fails t.
func eachGoFile(t *testing.T, root string, tests bool, f func(rel string, src []byte) error) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || (!tests && strings.HasSuffix(path, "_test.go")) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		return f(rel, src)
	})
	if err != nil {
		t.Fatal(err)
	}
}
