package sim

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/deptest"
)

// TestPurity keeps the simulator's core pure: no network, processes,
// namespaces, files, goroutines or wall clock in package sim (traces come in
// through an fs.FS the caller opens; the real counterparts live in
// internal/lab, which imports sim, never the other way round). What sim may
// depend on transitively is internal/deptest's rules.
func TestPurity(t *testing.T) {
	banned := map[string]bool{
		"os": true, "os/exec": true, "os/signal": true, "net": true, "syscall": true, "unsafe": true,
		"sync": true, "sync/atomic": true, "runtime": true, "log": true, "log/slog": true, "database/sql": true,
		"crypto/rand": true, "embed": true, "plugin": true,
	}
	forbid := func(p string) bool {
		return banned[p] || strings.HasPrefix(p, "net/") || strings.Contains(p, "/internal/") &&
			!strings.HasSuffix(p, "/internal/placement") && !strings.HasSuffix(p, "/internal/fabric") &&
			!strings.HasSuffix(p, "/internal/svgtext")
	}
	bad, err := deptest.ImpuritiesIn(".", forbid)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
}
