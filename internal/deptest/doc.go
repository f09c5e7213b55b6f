// Package deptest holds the repository's dependency rules (Rules) and the
// check that applies them to packages and their dependencies as `go list`
// reports them (Check). Its test runs the check over the whole module, so
// `make test` fails when a package imports what its layer must not: the
// pure policies (placement, fabric, resource, the simulator's core) reach
// no network, process, database or system-call package and nothing of the
// control plane, agent or data planes; the simulator never reaches the
// control plane; api reaches nothing under internal/; the data planes
// reach neither api nor the control plane. See docs/CONTRIBUTING.md.
//
// StoredContexts finds struct fields of type context.Context in a source
// file; its test runs it over every Go file of the module, tests included,
// so that ctx is passed to what blocks and never kept in a struct.
//
// Impurities (and ImpuritiesIn, over a directory) lists what makes a
// source file impure: imports a package's own policy forbids, go
// statements and wall-clock calls. The pure policies' packages (placement
// and fabric, the simulator's core, the lease state machine) run it from
// their TestPurity with their own import lists.
//
// UintptrAddresses lists where a source file turns a pointer into a
// uintptr address outside a system call's argument list; its test runs it
// over the module, where only reviewed places (memory that never moves)
// may.
//
// DocProblems checks a package directory for the doc.go every package
// has (its package comment there and nowhere else); its test runs it over
// every package of the module.
//
// The model is tailscale's tstest/deptest. Only the packages' own (non-test)
// dependencies count: a test may import what its package may not.
//
// Everything here is pure and safe for concurrent use; the zero Rule
// applies to no package.
package deptest
