package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The committed raw runs must give exactly the tables published in
// docs/bench/house.md (the step tables' commit cells carry a note after the
// commit in the document, so only the cells after it are compared there).
func TestReproducesHouseTables(t *testing.T) {
	docs := filepath.Join("..", "..", "..", "docs", "bench")
	doc, err := os.ReadFile(filepath.Join(docs, "house.md"))
	if err != nil {
		t.Fatal(err)
	}
	labels := []string{"f6c99ff", "0a11911", "5eb1721", "d24ea3a", "a4d0389", "cc40a31", "ec76518"}
	for _, tc := range []struct {
		raw              string
		steps, pathsteps bool
		labels           []string
	}{
		{raw: "house-raw.txt"},
		{raw: "house-steps.txt", steps: true, labels: labels},
		{raw: "house-pathsteps.txt", pathsteps: true, labels: labels},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			var out, stderr bytes.Buffer
			if err := run(&out, &stderr, filepath.Join(docs, tc.raw), tc.labels, tc.steps, tc.pathsteps); err != nil {
				t.Fatal(err)
			}
			if stderr.Len() > 0 {
				t.Errorf("warnings: %s", stderr.String())
			}
			if !tc.steps && !tc.pathsteps {
				for _, part := range strings.Split(out.String(), "\n\nSteal") {
					if !strings.HasPrefix(part, "| measurement") {
						part = "Steal" + part
					}
					if !bytes.Contains(doc, []byte(part)) {
						t.Errorf("house.md lacks this part of the output:\n%s", part)
					}
				}
				return
			}
			rows := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(rows) != 2+len(tc.labels) {
				t.Fatalf("%d rows, want %d:\n%s", len(rows), 2+len(tc.labels), out.String())
			}
			for i, l := range tc.labels {
				row := rows[2+i]
				rest := strings.TrimPrefix(row, "| "+l+" |")
				found := false
				for _, d := range strings.Split(string(doc), "\n") {
					if strings.HasPrefix(d, "| "+l) && strings.HasSuffix(d, " |"+rest) {
						found = true
						break
					}
				}
				if !found {
					t.Errorf("house.md has no row like %q", row)
				}
			}
		})
	}
}

func TestNum(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{0, "0"}, {449920, "449920"}, {122.5, "122"}, {123.5, "124"}, {35.25, "35.2"},
		{5.755, "5.75"}, {0.534, "0.534"}, {0.54, "0.54"}, {0.0096, "0.0096"}, {-12.34, "-12.3"},
	} {
		if got := num(tc.v); got != tc.want {
			t.Errorf("num(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestUnknownLabel(t *testing.T) {
	raw := filepath.Join(t.TempDir(), "steps.txt")
	if err := os.WriteFile(raw, []byte("### 1 abc controlplane steal=0.0 load1=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, stderr bytes.Buffer
	err := run(&out, &stderr, raw, []string{"def"}, true, false)
	if err == nil || !strings.Contains(err.Error(), `"abc" is not among the labels`) {
		t.Fatalf("err = %v, want an unknown-label error", err)
	}
}
