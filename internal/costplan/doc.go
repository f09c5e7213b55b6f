// Package costplan is seed 002's deployment calculator behind `rialto plan`:
// given today's CPU fleet, the share of host CPU a function takes, the load
// and measured per-slot accelerator throughput, and a price table
// (on-premises unit costs, cloud hourly prices), it computes how many
// servers (and accelerators) each deployment needs and what it costs
// (one-off for on-premises, per year for cloud).
//
// Compute is a pure function of its Inputs: no I/O, no clock. The zero
// Inputs computes nothing; PaperInputs returns the inputs of seed 002's
// Table 1. Values are safe to share between goroutines.
package costplan
