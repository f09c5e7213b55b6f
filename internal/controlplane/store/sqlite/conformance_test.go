package sqlite

import (
	"context"
	"testing"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/storetest"
)

// TestConformance runs the store conformance suite shared with the
// PostgreSQL store; the limits are checked by the statements both share
// (sqlstore).
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Options{Limits: true, Open: func(t *testing.T) store.Store {
		s, err := Open(context.Background(), ":memory:")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}})
}
