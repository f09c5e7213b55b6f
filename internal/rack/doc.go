// Package rack runs an emulated rack on one Linux machine: the control plane
// (a `rialto server` process, SQLite in the state dir) and N agents (`rialto
// agent` processes lending file-backed block devices, memory and accelerator
// slots), each process in its own network namespace. The namespaces hang off
// one bridge in the root namespace by veth pairs (internal/netns), every link
// optionally shaped with tc tbf, and each process binds to its namespace's
// address. The borrower (a shell, `rialto attach`, nbdinfo, nbdcopy, a
// benchmark) stays in the root namespace and reaches everything through the
// bridge: leases' URIs name the agents' namespace addresses.
//
//	r, err := rack.Start(ctx, rack.Config{Binary: bin, StateDir: dir, Agents: 3,
//		Disks: 2, DiskSize: 1 << 30, LinkRate: "1gbit"})
//	...
//	defer r.Close()
//	l, err := r.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 64 << 20})
//	exec.Command("nbdinfo", l.URI)             // from the root namespace
//	r.KillAgent(0)                             // SIGKILL node1's process
//	r.StartAgent(ctx, 0)                       // same state dir: the same node
//	r.Counters(r.Agent(0))                     // bytes over node1's link
//	r.Command(ctx, r.Agent(1), "iperf3", "-s") // a process inside node2's namespace
//
// With Config.Uplinks every agent also has wan0, a link to an outside
// network (netns.AddOutside) whose Server address only the agents reach,
// and lends it as NIC "wan" (--nic): what a borrower of a NIC lease reaches
// through it.
//
// Layout: host 0 of the lab is the control plane ("controlplane", API on
// port 7070 of its address), host i is agent "nodei" with state dir
// StateDir/nodei; the root namespace has the bridge's first address
// (Gateway). Addresses come from a free 10.213.x.0/24; the subnet a state dir
// used last is asked for again, so addresses (and the API URL) stay the same
// across runs when they can. The database is StateDir/rialto.db, as for the
// in-process `rialto up`, so both share a state dir's layout. Each process's
// stdout and stderr are appended to StateDir/logs/NAME.log.
//
// The control plane serves its API over HTTPS with a certificate from the
// cluster CA in StateDir/tls (created at the first Start; CACert names its
// certificate), which the agents and the Rack's client verify against.
//
// Secrets (the bootstrap and admin tokens) reach the processes through their
// environment, never their command line. Every process is a child the Rack
// owns, in its own process group (a terminal's Ctrl-C reaches only the
// caller, which then stops them in order).
//
// Cleanup. Close stops the agents (SIGTERM, then SIGKILL after a grace
// period), then the control plane, then deletes the namespaces, veth pairs
// and bridge. If the caller dies without Close (SIGKILL, a crash), a reaper
// process cleans up: Start launches the rialto binary with a hidden argument
// (RunReaperIfChild, called first thing in rialto's main), holding the read
// end of a pipe whose write end only the caller has; when the pipe closes
// without the word "done" the reaper purges the lab (netns.Purge: kills the
// processes in its namespaces, deletes namespaces and links). The lab's ID is
// recorded in StateDir/rack.json before anything is created, so if the
// reaper died too, the next Start on the same state dir purges what is left.
// The state dir is locked (StateDir/lock, shared with `rialto up`) for as
// long as the rack or its reaper runs.
//
// Limits: tbf shapes bandwidth only; this kernel has no netem, so there is no
// added delay or loss. The links are veth pairs through one bridge: every
// node is one hop from every other, and the CPU is shared by all of them.
//
// Start needs root and ip(8)/tc(8) (Available says why not). The zero value
// of Rack is not usable; call Start. A Rack's methods are safe for concurrent
// use; after Close, the methods that start or stop processes return
// ErrClosed, and further Close calls return the first one's result.
package rack
