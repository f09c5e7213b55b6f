package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/storetest"
)

// BenchmarkLeaseCycle measures the store's share of a lease cycle: one
// writer, batches of 16 (storetest.LeaseCycles).
func BenchmarkLeaseCycle(b *testing.B) {
	s, err := Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.LeaseCycles(b, []store.Store{s}, 1, 16)
}
