package postgres

import (
	"context"
	"testing"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/storetest"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestConformance runs the store conformance suite shared with the SQLite
// store, with three Stores (replicas) on one database for the concurrent
// writers.
func TestConformance(t *testing.T) {
	urls := map[store.Store]string{}
	storetest.Run(t, storetest.Options{
		Limits: true,
		Open: func(t *testing.T) store.Store {
			url := pgtest.DB(t)
			s, err := Open(context.Background(), url, Options{})
			if err != nil {
				t.Fatal(err)
			}
			urls[s] = url
			return s
		},
		Reopen: func(t *testing.T, s store.Store) store.Store {
			r, err := Open(context.Background(), urls[s], Options{})
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	})
}

// pathOps are the suite's lease tests that the pipeline's fallback paths
// must pass too.
var pathOps = []string{"Capacity", "BatchRefusals", "Transitions", "LostPartsAndCaps", "Idempotency", "Limits", "ConcurrentWriters", "ConcurrentIdempotencyKey", "ReplaceParts", "GatewayKey"}

// runPath runs pathOps on stores opened with o.
func runPath(t *testing.T, o Options) {
	urls := map[store.Store]string{}
	open := func(t *testing.T, url string) store.Store {
		s, err := Open(context.Background(), url, o)
		if err != nil {
			t.Fatal(err)
		}
		urls[s] = url
		return s
	}
	storetest.Run(t, storetest.Options{
		Limits: true,
		Only:   pathOps,
		Open:   func(t *testing.T) store.Store { return open(t, pgtest.DB(t)) },
		Reopen: func(t *testing.T, s store.Store) store.Store { return open(t, urls[s]) },
	})
}

// TestConformanceSequential runs the suite's lease tests with every batch
// written statement by statement (sqlstore.Core.WriteOps and this
// package's InsertLease and TransitionTx): the path of a batch in which
// an op failed after writing, which the pipeline leaves otherwise.
func TestConformanceSequential(t *testing.T) { runPath(t, Options{sequential: true}) }

// TestConformanceTwoTrips runs the suite's lease tests with every batch's
// creations judged in a first round trip (pipeline.go's readForCreations):
// the path of a batch in which a creation checking itself in its write
// statement was refused.
func TestConformanceTwoTrips(t *testing.T) { runPath(t, Options{twoTrips: true}) }
