// Package validate checks the simulator against the real data plane (issue
// 7, item 4): 1–6 concurrent sequential writers on 1, 2 and 3 lenders whose
// links are shaped with tc tbf in network namespaces (internal/netns), each
// lender serving NBD exports (internal/dataplane/block/nbd) and each writer
// writing through a RAID0 volume over the lenders (internal/dataplane/
// block/stripe); the same scenario runs in the simulator (sim.Net with the
// fabric's max-min sharing), and the delivered bandwidth of every writer is
// compared. The lab runs TCP Reno on 40 Mbit/s links with 1.25 MB queues
// (where real flows share a link as the simulator's do), and every scenario
// records whether its links were busy (the tbf counters) so that a caller
// can tell a model error from a machine too loaded to fill the links.
//
// Unlike package sim this package does I/O and starts goroutines: Run owns
// every goroutine and server it starts, and stops and waits for them before
// returning. It needs root and ip(8)/tc(8) (netns.Available).
//
// Zero values: Config's zero fields take defaults. Run is safe to call from
// one goroutine at a time per process (labs are independent, but the
// scenario is meant to own the CPU while it measures).
package validate
