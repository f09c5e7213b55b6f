// Package agent is Rialto's node agent: it fingerprints its host, joins the
// control plane with a bootstrap token, heartbeats with its health, the
// leases it serves and round-trip measurements to the control plane and to
// its peers, executes the control plane's lease decisions (prepare and
// teardown of exports, authenticated with the agent key) and hosts the data
// planes (an NBD server for block devices, a donor for memory).
//
// Each resource kind is served by a [Driver]; a driver that also implements
// [Server] gets a listener of its own, whose address is the kind's endpoint,
// and one that implements [Runner] is run for as long as the agent runs.
// Built-in drivers serve block devices (files or devices) over NBD, one
// nbd.FileBackend per export ([BlockDriver]),
// memory regions through the memory donor ([MemoryDriver]) and accelerator
// slots through an appliance per accel device ([AccelDriver]: a slot of its
// own per dedicated lease, a batching gateway per role shared by shared
// leases);
// [Config.Drivers] replaces or adds drivers.
//
// Identity (node ID, node credential and the last few it replaced, agent
// key, machine ID, ports) and the exports the agent serves, each with the
// URI the control plane was given, are persisted in [Config.StateDir] with
// mode 0600, so a restarted agent rejoins with the same identity and serves
// the same exports, at the same addresses when it can bind them again ([Export].URI). It fails closed: a
// restored export is held, not served, until the control plane's first
// heartbeat answer confirms its lease (a lease it no longer wants is torn
// down unserved), and an export whose lease's known expiry passes without a
// renewal the agent could confirm stops being served (suspended, its data
// kept) until one shows up. Block ranges are wiped before they return to
// the pool, through a durable journal ([Wiper]): a range whose wipe has not
// finished is lent to no one, and a restart finishes it first. The ports it remembers are held from
// before its devices open until their owners bind them again, so that no
// fresh accelerator slot port takes one. An export that must move anyway is
// served at a new address with a warning, and the heartbeats report it
// ([Export].Moved) until the control plane has recorded it.
// While Run runs, the agent holds an exclusive flock on its state
// directory (agent.lock) and on every block device it lends, taken before
// it reads either: a second agent on the same state directory or device
// refuses to start ([ErrInUse]) instead of rewriting the first's state or
// wiping its tenants' bytes as lost state; the kernel drops the locks
// when the process ends, however it ends.
//
// TLS ([Config.CAFile]): the agent trusts the cluster CA, joins with a CSR
// for its key (node-key.pem, 0600) and keeps the node certificate the
// control plane signs (node-cert.pem: common name the node ID, the node's
// host as subject alternative name, short-lived), renews it when a third
// of its lifetime is left, and presents it on every call to the control
// plane and its peers. Its API is then HTTPS: lease-execution calls need
// the control plane's certificate (pki.ControlPlaneCN) besides the agent
// key. A certificate the control plane no longer accepts (revoked, or
// expired: the agent stops presenting it) answers 401, and the agent joins
// again. The agent keeps the
// CA's revocation list (ca-crl.pem) that the join and heartbeat answers
// bring, and refuses the certificates it names at its API and when it
// dials data planes. It verifies with the CA certificates those answers
// bring too (after a `rialto ca rotate`, the new CA's and the old one's:
// useCA), kept as ca-cert.pem in the state dir and used at start instead
// of Config.CAFile's while that file is unchanged, so that a control
// plane restarted with a certificate of the new CA is still trusted, and
// so are the data planes it dials (a move's destination, a block lease an
// accelerator slot reads, a gateway's slots) once their certificates come
// from it: the drivers take the client configuration of the CA
// certificates in use at each dial ([TLSUser]). Its data planes require TLS with the node certificate
// (drivers implementing [TLSUser]: nbds://, rialto-mems://, rialto-nics://,
// rialto-accels:// URIs, no client certificate asked for, accelerator
// slots without their UDP path) unless [Config.InsecureDataplane].
//
// A part of a lease can move to another lender while it is served
// ([Mover], transfer.go): the control plane has the destination receive
// the range under a transfer-only token, the source push it in passes over
// what the borrower writes meanwhile (holding the writes for the last
// pass), then seals, commits the destination (which serves the part) and
// commits the source (which retires the old export cleanly, tears it down
// and journals its range, and answers; the range is wiped in the
// background). Block parts move over NBD, memory parts page by page over
// the memory protocol. Transfers are not persisted: a restart forgets
// them, and the destination's received range, journaled for a wipe from
// the start, is wiped.
//
// Zero values: a zero Config is not usable (ControlPlane, BootstrapToken,
// Name and StateDir are required); use [New]. [Faults] is ready at its zero
// value (no faults).
//
// Concurrency: an Agent is run once with [Agent.Run], which owns every
// goroutine it starts and returns after they have all exited. Its other
// methods and its Faults are safe for concurrent use while it runs.
package agent
