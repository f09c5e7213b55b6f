// Package sqlstore is the part of the control plane's SQL stores written
// once for both databases: the statements of store.Store and their Go
// logic (nodes, devices, links, profiles, tokens, idempotency keys, lease
// plans and parts, leases, moves, events), in the SQL that SQLite and
// PostgreSQL share, with "?" placeholders (PostgreSQL's Execer rewrites
// them). store/sqlite and store/postgres embed a Core and keep only what
// differs, behind the Dialect interface:
//
//   - opening the database, its migrations and their runner;
//   - transactions (SQLite: one writer connection, BEGIN IMMEDIATE;
//     PostgreSQL: READ COMMITTED, re-run after a deadlock or a
//     serialization failure) and how errors are classified;
//   - locking: PostgreSQL's replicas lock what a write re-checks (FOR
//     UPDATE on devices and leases, advisory locks on tenants and on the
//     event log); SQLite's single writer locks nothing;
//   - the hot statements whose best form differs: a lease creation and a
//     transition are one statement on PostgreSQL (data-modifying WITH,
//     unnest, jsonb_set: a round trip each would be most of their cost,
//     and whole batches are pipelined, store/postgres/pipeline.go); on
//     SQLite, where a statement costs no round trip, they are several
//     prepared statements, and a transition of a cached live lease skips
//     reading its row back (store/sqlite/live.go). Heartbeat batches and
//     bulk event appends differ the same way (unnest vs one statement per
//     node, multi-row VALUES).
//
// Times are stored as Unix nanoseconds and values as JSON text (codec.go:
// NS, JSON; TextCache keeps what was decoded), so that one schema's
// columns suit both databases.
//
// A Core's zero value is not usable: a dialect's Store embeds it and
// calls Init with its Dialect before use. A Core is safe for concurrent
// use when its Dialect is; its caches (decoded plans and parts) belong to
// it, and two Cores share nothing.
package sqlstore
