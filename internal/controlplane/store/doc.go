// Package store defines the persistence interface of the control plane: the
// tables of nodes, devices, links (topology), leases with their parts,
// profiles, the append-only event log, hashed tokens and idempotency keys.
//
// The interface is small and shaped by what the control plane needs; its
// write methods are transactional and carry the audit event to append in
// the same transaction. Implementations (store/sqlite, store/postgres,
// both mostly store/sqlstore) must guarantee that a device is never over-committed: the capacity
// and overlap checks of CreateLease and ReplaceParts happen atomically with
// the insertion of the parts.
//
// There is no useful zero value; implementations are safe for concurrent
// use by many goroutines.
package store
