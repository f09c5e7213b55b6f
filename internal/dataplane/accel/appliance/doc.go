// Package appliance is, in software, the accelerator shell of the
// network-attached FPGA paper (Weerasinghe et al., "Disaggregated FPGAs:
// Network Performance Comparison against Bare-Metal Servers, Virtual
// Machines and Linux Containers"): a persistent process that registers with
// a control plane and heartbeats, exposes a management API (list slots, load
// a role into a slot, unload, reset, lease credentials, stats, health), and
// virtualises its memory into per-slot chunks through an offset table, so a
// slot can never address another slot's memory. Each slot listens on its own
// port and speaks the accel mailbox protocol; a role can be loaded, reloaded
// or unloaded in one slot while the others keep serving.
//
// Build an Appliance with New (which binds the slot listeners) and serve it
// with Run; Close releases the listeners of an appliance that never ran.
// Rebind moves a slot's listener to a chosen address, running or not (an
// agent serving a lease again where a previous run served it).
// The zero value is not usable. All methods are safe for concurrent use.
// Run owns every goroutine it starts and waits for them before returning;
// a LOAD into a streaming role (roles.Streamer) owns the one goroutine that
// feeds the role its windows, and waits for it before it replies.
package appliance
