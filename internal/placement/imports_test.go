package placement

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/deptest"
)

// TestPurity keeps placement and fabric pure: no I/O, network, database,
// logging, concurrency or randomness packages, no goroutines, and no wall
// clock (time.Duration is fine; time.Now and friends are not). The import
// rules between packages are internal/deptest's.
func TestPurity(t *testing.T) {
	banned := map[string]bool{
		"os": true, "os/exec": true, "os/signal": true, "net": true, "net/http": true, "net/netip": true,
		"io": true, "io/fs": true, "io/ioutil": true, "bufio": true, "database/sql": true,
		"log": true, "log/slog": true, "syscall": true, "unsafe": true, "sync": true, "sync/atomic": true,
		"math/rand": true, "math/rand/v2": true, "crypto/rand": true, "runtime": true, "context": true,
		"embed": true, "plugin": true,
	}
	forbid := func(p string) bool {
		return banned[p] || strings.HasPrefix(p, "net/") || strings.Contains(p, "controlplane") ||
			strings.Contains(p, "dataplane") || strings.Contains(p, "agent")
	}
	for _, dir := range []string{".", "../fabric"} {
		bad, err := deptest.ImpuritiesIn(dir, forbid)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Error(b)
		}
	}
}
