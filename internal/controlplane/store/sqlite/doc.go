// Package sqlite implements store.Store on SQLite with the pure-Go driver
// modernc.org/sqlite: WAL journal, one writer connection (every write is a
// BEGIN IMMEDIATE transaction, so reservations are serialized and a device
// is never over-committed) and a pool of read-only connections. The schema
// lives in migrations/*.sql, embedded in the binary and applied in order at
// Open; the schema_version table records which have run.
//
// The statements and their Go logic are sqlstore's, shared with the
// PostgreSQL store; this package holds SQLite's dialect (dialect.go):
// opening, pragmas, the migrations and their runner (sqlite.go), prepared
// statements (stmt.go), and the lease writes, heartbeats and event appends
// in SQLite's best form (leases.go, nodes.go, events.go): several prepared
// statements rather than one, and a cache of live leases (live.go), so
// that a transition need not read its row back. The caches (decoded plans
// and parts, statements, live leases) belong to the Store value: two
// Stores share nothing.
//
// A *Store is safe for concurrent use; Close it when done.
package sqlite
