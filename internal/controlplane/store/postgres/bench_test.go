package postgres

import (
	"context"
	"testing"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/storetest"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

// BenchmarkLeaseCycle measures the store's share of a lease cycle with
// three replicas (Stores) on one database, 12 writers (4 per replica)
// writing batches of 8 (storetest.LeaseCycles).
func BenchmarkLeaseCycle(b *testing.B) {
	url := pgtest.DB(b)
	var stores []store.Store
	for range 3 {
		s, err := Open(context.Background(), url, Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		stores = append(stores, s)
	}
	storetest.LeaseCycles(b, stores, 12, 8)
}
