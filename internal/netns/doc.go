// Package netns builds small network labs for tests and benchmarks: N
// "hosts", each a Linux network namespace joined to the root namespace by a
// veth pair whose root end is enslaved to a bridge the lab creates. Every link
// can be shaped with a token-bucket filter (tc tbf) in both directions, so a
// test can make the network, not the CPU, the bottleneck.
//
// Addresses come from 10.213.L.0/24, where L is a /24 not already in use in
// the root namespace: the bridge gets 10.213.L.1 and host i gets 10.213.L.(i+2).
// Only interfaces the lab creates carry these addresses, and Close removes them
// together with the namespaces. Names carry a lab ID (random, or chosen by
// the caller with Config.ID), so labs in concurrent tests and processes do
// not collide; Config.Subnet asks for a particular /24 (a previous run's),
// used if free.
//
// A process that builds a lab and is killed before it calls Close leaves the
// lab behind. Purge removes it from its ID alone (namespaces, the processes
// inside them, veth pairs and bridge, found by name), and Leftovers lists
// what is left of it; internal/rack records the ID before building the lab
// so that a reaper process or the next run can do so.
//
// AddOutside adds a network beyond chosen hosts: a namespace joined to each
// of them by a veth pair of its own (the host's "wan0"), shaped like the
// lab's links, with a Server address that only those hosts route to; it is
// what a lent NIC leads to (internal/dataplane/nic). Close and Purge
// remove it with the lab.
//
// Counters reads the kernel's byte counters of a host's link.
//
// New needs root and the ip(8) and tc(8) tools; Available reports whether the
// machine can build a lab, which tests use to decide whether to skip.
//
// The zero value of Lab is not usable; call New. A Lab's methods are safe for
// concurrent use; Close must be called exactly once, after which the Lab must
// not be used. Close kills any process still running inside the lab's
// namespaces (they can only have been started by the lab's user) before it
// deletes them.
package netns
