// Package robustness checks the control plane's lease table the way
// etcd's robustness tests check etcd: concurrent clients create, renew,
// release and read leases through the API while faults are injected
// (control-plane replicas SIGKILLed and restarted, PostgreSQL itself
// restarted); every operation is recorded with its call and return times
// and its outcome, and the history is checked for linearizability
// (porcupine, the checker of Athalye et al.) against a model of the lease
// table (model.go). The model encodes the safety properties: no
// acknowledged create disappears, no released lease comes back, no device
// range is held by two active leases, no tenant exceeds its quota.
//
// The package's code is test support: Workload runs the clients and
// records the History; Check runs the checker. Its tests run the clients
// against real `rialto server` processes on a real PostgreSQL
// (robustness_test.go), and show the checker failing on planted
// violations: synthetic histories, a store that loses acknowledged writes,
// and a deliberately broken model.
//
// The zero values are not useful; a Workload's Run may be called once.
// Recording is safe for concurrent use by the workload's clients.
package robustness
