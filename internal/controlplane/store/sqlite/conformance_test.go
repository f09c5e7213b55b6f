package sqlite

import (
	"context"
	"testing"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/storetest"
)

// TestConformance runs the store conformance suite shared with the
// PostgreSQL store.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Options{Open: func(t *testing.T) store.Store {
		s, err := Open(context.Background(), ":memory:")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}})
}
