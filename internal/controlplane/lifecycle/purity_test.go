package lifecycle

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/deptest"
)

// TestPurity keeps the state machine pure: no I/O, network, database,
// logging, concurrency or randomness packages, no goroutines and no wall
// clock (time values are fine; time.Now and friends are not). The caller
// performs the actions; Step only decides them.
func TestPurity(t *testing.T) {
	banned := map[string]bool{
		"os": true, "os/exec": true, "os/signal": true, "net": true, "net/http": true, "net/netip": true,
		"io": true, "io/fs": true, "bufio": true, "database/sql": true, "log": true, "log/slog": true,
		"syscall": true, "unsafe": true, "sync": true, "sync/atomic": true, "context": true, "runtime": true,
		"math/rand": true, "math/rand/v2": true, "crypto/rand": true, "embed": true, "plugin": true,
	}
	forbid := func(p string) bool {
		return banned[p] || (strings.HasPrefix(p, "net/") && p != "net/url") ||
			(strings.HasPrefix(p, "github.com/rialto-project/rialto/internal/") && p != "github.com/rialto-project/rialto/internal/controlplane/store")
	}
	bad, err := deptest.ImpuritiesIn(".", forbid)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
}
