// Package fabric models the interconnect between Rialto nodes: a topology
// graph of hosts, switches and PCIe roots joined by links with a bandwidth,
// a latency and a kind (ethernet, pcie-ntb, pcie, mesh, loopback); shortest
// paths by hop count or by latency; weighted max-min fair sharing of link and
// device bandwidth among flows (progressive filling); and the seeds' rules as
// named functions (NTB crossing latency, CPU-root read splitting, the UDP
// line-rate formula).
//
// The package is pure: no goroutines, no I/O, no wall clock. The zero value
// of Graph is an empty graph with no vertices; build one with NewGraph. A
// Graph is immutable after NewGraph and safe for concurrent readers. A Solver
// keeps scratch buffers between calls and is not safe for concurrent use; its
// zero value is ready to use.
package fabric
