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
// The other counterparts, each keyed by the experiment it measures and run
// by Counterpart (`rialto sim run NAME --real`):
//
//   - rack-fig8 (RunRackFig8): the layouts of Fig. 8 of the NVMe-oF genomics
//     paper (Call et al.) on an emulated rack (internal/rack: a control
//     plane and `rialto agent` processes in namespaces), devices behind tbf
//     links characterized through the data plane, leases created through
//     the API, five writers in the root namespace;
//   - hop-relay (RunHopRelay): 4 KiB reads on an NBD export through relays
//     that delay every byte (Relay, Chain: a stand-in for fabric hops, as
//     this kernel has no netem);
//   - qpair-credits (RunQPair, MeasureQPair): a memory queue pair whose data
//     connection a relay paces and delays and whose control connection,
//     which carries the credits, it delays;
//   - erbium-related (RunRelated): the local MCT rule scan against one
//     CallBatch to an appliance slot running the MCT role;
//   - nic-efficiency and nic-bond (RunNICRack): an emulated rack whose
//     agents lend their tbf-shaped uplinks; leases of a whole interface
//     and bonds made through the API and attached by `rialto attach` in a
//     borrower's namespace; iperf3 UDP through them and from a lender
//     itself, the payload counted on the uplinks, how busy each shaped
//     link was and the tunnel's TCP segments per packet counted on the
//     lenders' links (tc tbf's counters, over netlink).
//
// Where an emulated part does not deliver its nominal figure on a loaded
// machine (a relay's timers, a shaped link), the counterpart characterizes
// it and reports the simulator's value for the part as measured
// (sim.Real.Sim) beside the real figure.
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
