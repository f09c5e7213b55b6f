// Package lab measures Rialto's own code on real sockets, processes and
// network namespaces and puts each measurement beside the simulator's
// prediction of the same scenario (package sim). It is the simulator's real
// counterpart; the simulator's core never imports it.
//
// Writers (RunWriters): 1–6 concurrent sequential writers on 1, 2 and 3
// lenders whose links are shaped with tc tbf in network namespaces
// (internal/netns), each lender serving NBD exports
// (internal/dataplane/block/nbd) and each writer writing through a RAID0
// volume over the lenders (internal/dataplane/block/stripe); the same
// scenario runs in the simulator (sim.Net with the fabric's max-min
// sharing), and the delivered bandwidth of every writer is compared. The lab
// runs TCP Reno on 40 Mbit/s links with 1.25 MB queues (where real flows
// share a link as the simulator's do), and every scenario records whether
// its links were busy (the tbf counters) so that a caller can tell a model
// error from a machine too loaded to fill the links.
//
// Unlike package sim this package does I/O and starts goroutines: every Run
// function owns every goroutine, server and namespace it starts, and stops
// and waits for them before returning. Scenarios in namespaces need root and
// ip(8)/tc(8) (netns.Available); the others run on loopback.
//
// Zero values: configurations' zero fields take defaults. Run functions are
// safe to call from one goroutine at a time per process (labs are
// independent, but a scenario is meant to own the CPU while it measures).
package lab
