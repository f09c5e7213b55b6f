// Package fabric models the interconnect between Rialto nodes: a topology
// graph of hosts, switches and PCIe roots joined by links with a bandwidth,
// a latency and a kind (ethernet, pcie-ntb, pcie, mesh, loopback); shortest
// paths by hop count or by latency; weighted max-min fair sharing of link and
// device bandwidth among flows (progressive filling); and the papers' rules
// as named functions (NTB crossing latency and CPU-root read splitting from
// the Device Lending paper, Markussen et al.; the UDP line-rate formula from
// the network-attached FPGA paper, Weerasinghe et al.).
//
// The package is pure: no goroutines, no I/O, no wall clock. The zero value
// of Graph is an empty graph with no vertices; build one with NewGraph. A
// Graph is immutable after NewGraph and safe for concurrent readers. A Solver
// keeps scratch buffers between calls and is not safe for concurrent use; its
// zero value is ready to use.
package fabric
