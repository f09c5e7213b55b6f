// Package postgres is the control plane's store (store.Store) on
// PostgreSQL, for several control-plane replicas sharing one database
// (`rialto server --db postgres://…`). Its schema and migrations are the
// SQLite store's (store/sqlite), version for version, written in
// PostgreSQL's dialect where the two differ (migrations/); its statements
// are sqlstore's, shared with the SQLite store, with PostgreSQL's
// placeholders. This package holds PostgreSQL's dialect (dialect.go): the
// locks below, transactions re-run after a deadlock, the lease writes as
// one data-modifying statement each and batches pipelined in one round
// trip, two when a creation must be judged apart (leases.go, pipeline.go), heartbeat batches and event appends with
// unnest (nodes.go, events.go), and what only replicas need: the
// election and the leader's address (election.go, leader.go) and
// broadcasts between replicas (broadcast.go, LISTEN/NOTIFY).
//
// Writes that must be serialized between replicas are serialized by
// PostgreSQL itself, in each write transaction (READ COMMITTED):
//   - a lease creation or re-placement locks its devices' rows (FOR
//     UPDATE), in ID order, before it re-checks every part (device
//     available, node ready, inside the capacity, no overlap with a live
//     part): the check runs after the locks, on what the previous holder
//     committed, so two replicas placing on one device one after the
//     other cannot both win. Node rows are not locked: a creation reads
//     the node's committed state, so a node marked down while the
//     creation commits is handled as any node lost under a live lease;
//   - a creation that carries its tenant's Limit takes the tenant's
//     transaction-scoped advisory lock before it counts the tenant's
//     leases, so quotas hold across replicas;
//   - events are appended last, under the event log's transaction-scoped
//     advisory lock taken in shared mode: writers do not wait for one
//     another (their commits share WAL flushes), and a reader of the log
//     (Events, LastEventID) takes the lock in exclusive mode first, which
//     waits for every writer holding an event ID it cannot see yet;
//     followers of the event stream, which read "ID > last seen", thus
//     never skip an event committed after one with a higher ID. (Writers
//     used to take the lock exclusively, which serialized every replica's
//     commits, fsync included: with 3 replicas on a loaded machine it was
//     the largest lock wait, docs/bench/controlplane.md.)
//
// A lease transition's statement finds the lease and its parts by their
// primary keys only: its other conditions are written so that no other
// index can serve them, since a connection keeps the generic plan it made
// on a fresh database's empty tables, and such a plan scanned the tenant's
// every lease on each release (planGuard, pipeline.go).
//
// Locks are taken in one order (tenants, nodes, devices, leases, events);
// a deadlock or serialization failure that PostgreSQL reports anyway
// retries the transaction.
//
// Background duties run on one replica elected with a session-level
// advisory lock held on a dedicated connection (Campaign, election.go):
// when that replica dies, its session ends, PostgreSQL releases the lock,
// and another replica's next attempt takes it. The elected replica also
// places every lease for the others (the placement leader): it records
// its API address with its lock session's PID (CampaignAdvertising,
// leader.go), and LeaderURL returns that address only while that session
// holds the lock.
//
// A database that cannot be reached makes every call fail with
// store.ErrUnavailable.
//
// There is no useful zero value: Open returns a Store. A Store is safe
// for concurrent use.
package postgres
