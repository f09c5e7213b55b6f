package deptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocProblems shows each problem caught, and a clean package let through.
func TestDocProblems(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  []string // substrings of the problems, in order
	}{
		{"clean", map[string]string{"doc.go": "// Package p does p.\npackage p\n", "p.go": "package p\n", "p_test.go": "// Tests.\npackage p\n"}, nil},
		{"no doc.go", map[string]string{"p.go": "// Package p does p.\npackage p\n"}, []string{"carries a package comment", "has no doc.go"}},
		{"empty doc.go", map[string]string{"doc.go": "package p\n"}, []string{"has no package comment"}},
		{"two comments", map[string]string{"doc.go": "// Package p does p.\npackage p\n", "q.go": "// Package p again.\npackage p\n"}, []string{"q.go carries a package comment"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, src := range c.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := DocProblems(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %q, want %d problems %q", got, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d: %q does not say %q", i, got[i], w)
				}
			}
		})
	}
	if _, err := DocProblems(t.TempDir()); err == nil {
		t.Error("an empty directory gave no error")
	}
}

// TestRepositoryDocs: every package of the module has its doc.go.
func TestRepositoryDocs(t *testing.T) {
	cmd := exec.Command("go", "list", "-e", "-f", "{{.Dir}}", "./...")
	cmd.Dir = moduleRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dirs := strings.Fields(string(out))
	if len(dirs) < 10 {
		t.Fatalf("go list found %d packages", len(dirs))
	}
	for _, d := range dirs {
		problems, err := DocProblems(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Error(p)
		}
	}
}
