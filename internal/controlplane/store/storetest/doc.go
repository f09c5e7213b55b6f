// Package storetest is a conformance suite for store.Store
// implementations: the same tests run against SQLite (store/sqlite) and
// PostgreSQL (store/postgres), so that the control plane sees one
// behaviour whichever it is given.
//
// Run calls Open for each test; a Store it returns is closed by the test.
// LeaseCycles is the stores' common benchmark (a lease cycle as the
// control plane's group commit writes it). The package has no state: Run
// may be called by several tests.
package storetest
