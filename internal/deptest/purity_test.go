package deptest

import (
	"reflect"
	"strings"
	"testing"
)

func TestImpurities(t *testing.T) {
	noOS := func(p string) bool { return p == "os" }
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"pure", "package p\nimport \"time\"\nfunc f(d time.Duration) time.Duration { return 2 * d }\n", nil},
		{"forbidden import", "package p\nimport \"os\"\nvar _ = os.Args\n", []string{"p.go:2:8: imports os"}},
		{"go statement", "package p\nfunc f() { go f() }\n", []string{"p.go:2:12: go statement"}},
		{"wall clock", "package p\nimport \"time\"\nvar t = time.Now()\n", []string{"p.go:3:9: time.Now"}},
		{"wall clock renamed", "package p\nimport tm \"time\"\nfunc f() { tm.Sleep(1) }\n", []string{"p.go:3:12: time.Sleep"}},
		{"another package's Now", "package p\nimport \"example.com/clock\"\nvar t = clock.Now()\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Impurities("p.go", []byte(c.src), noOS)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
	if _, err := Impurities("p.go", []byte("package"), nil); err == nil || !strings.Contains(err.Error(), "p.go") {
		t.Errorf("a file that does not parse: %v", err)
	}
}

func TestImpuritiesIn(t *testing.T) {
	if _, err := ImpuritiesIn(t.TempDir(), nil); err == nil {
		t.Error("a directory without Go files passed")
	}
	bad, err := ImpuritiesIn("../placement", func(p string) bool { return p == "fmt" })
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) == 0 {
		t.Error("placement imports fmt, and a policy forbidding it found nothing")
	}
}
