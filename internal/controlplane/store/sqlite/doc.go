// Package sqlite implements store.Store on SQLite with the pure-Go driver
// modernc.org/sqlite: WAL journal, one writer connection (every write is a
// BEGIN IMMEDIATE transaction, so reservations are serialized and a device
// is never over-committed) and a pool of read-only connections. The schema
// lives in migrations/*.sql, embedded in the binary and applied in order at
// Open; the schema_version table records which have run.
//
// Each table has its file (nodes.go, devices.go, links.go, leases.go,
// lease_parts.go, lease_plans.go, idempotency_keys.go, events.go,
// tokens.go, profiles.go); inventory.go reads across them. The caches
// (decoded plans and parts, statements, live leases) belong to the Store
// value: two Stores share nothing.
//
// A *Store is safe for concurrent use; Close it when done.
package sqlite
