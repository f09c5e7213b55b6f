// Package costplan is the deployment calculator of the ERBIUM paper (Maschi
// and Alonso, "The Difficult Balance Between Modern Hardware and
// Conventional CPUs") behind `rialto cost`: given today's CPU fleet, the
// share of host CPU a function takes, the load and measured per-slot
// accelerator throughput, and a price table (on-premises unit costs, cloud
// hourly prices), it computes how many servers (and accelerators) each
// deployment needs and what it costs (one-off for on-premises, per year for
// cloud).
//
// Compute is a pure function of its Inputs: no I/O, no clock. The zero
// Inputs computes nothing; PaperInputs returns the inputs of the paper's
// Table 1. Values are safe to share between goroutines.
package costplan
