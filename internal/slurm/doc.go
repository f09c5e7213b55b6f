// Package slurm is the glue between Slurm and Rialto: a batch job asks
// for devices in its comment (`sbatch --comment 'rialto: block 100GiB
// composed 3'`), the node's Prolog creates the leases before the job
// starts (idempotently: the key is the cluster, job ID, the job's uid and
// restart count, so a retried prolog neither leaks nor doubles a lease, and
// a job ID Slurm reuses for another user never reaches the earlier job's), the TaskProlog
// hands their IDs and URIs to the job's environment (or fails the job with
// placement's reason in its output), and the Epilog and EpilogSlurmctld
// release them however the job ended. `rialto slurm` runs these steps;
// docs/slurm.md has the slurm.conf lines and says why this design rather
// than burst_buffer/lua.
//
// Functions take a context and an api.Client; they hold no state between
// calls beyond the per-job file in a state directory. ParseComment is
// pure. Everything is safe for concurrent use across jobs.
package slurm
