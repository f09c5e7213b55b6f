// Package characterize measures a real block device through Rialto's data
// plane (any io.ReaderAt/io.WriterAt, in practice an NBD client) and turns
// the measurements into an api.Profile: delivered aggregate bandwidth for
// 1..N concurrent sequential writers and readers, and 4 KiB random-read
// latency. Placement predicts saturation from such profiles, as the NVMe-oF
// genomics paper (Call et al., "Disaggregating Non-Volatile Memory for
// Throughput-Oriented Genomics Workloads") measured it.
//
// Measure is safe to call from one goroutine at a time per device; it
// starts and waits for its own worker goroutines and leaves none behind.
package characterize
