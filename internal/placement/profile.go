package placement

import "math"

// Calibration against the NVMe-oF genomics paper (Call et al.,
// "Disaggregating Non-Volatile Memory for Throughput-Oriented Genomics
// Workloads"; docs/placement.md): an NVMe device that writes 2 GB/s
// sequentially, SMUFIN-like writers that each want 477 MB/s, and a
// delivered-bandwidth curve that falls under concurrency so that one device
// holds 2 writers but not 3, a 2-device composition 3 but not 4, and a
// 3-device composition 5, with the 6th slowing writers by about 2.5%.
const (
	SMUFINModel          = "smufin-nvme"
	SMUFINMaxBandwidth   = 2.0e9
	SMUFINWriterDemand   = 477e6
	SMUFINWriterWork     = 150e9
	SlowdownTolerance    = 0.01 // a rate within 1% of the need meets it
	TightDeadlineRatio   = 0.8  // needing ≥ 80% of the alone rate is tight
	defaultAlignBytes    = 4096
	defaultCandidateGoal = 16
)

// SMUFINProfile returns the NVMe profile calibrated against the NVMe-oF
// genomics paper (Call et al., "Disaggregating Non-Volatile Memory for
// Throughput-Oriented Genomics Workloads"; SMUFIN).
func SMUFINProfile() Profile {
	return Profile{
		Model:        SMUFINModel,
		MaxBandwidth: SMUFINMaxBandwidth,
		Delivered:    []float64{2.0e9, 1.7e9, 1.25e9, 0.94e9, 0.935e9, 0.93e9, 0.925e9, 0.92e9},
	}
}

// Capacity is the aggregate bandwidth in bytes/s the device delivers with n
// concurrent streams (+Inf when unconstrained).
func (p Profile) Capacity(n int) float64 {
	if len(p.Delivered) == 0 {
		if p.MaxBandwidth <= 0 {
			return math.Inf(1)
		}
		return p.MaxBandwidth
	}
	if n < 1 {
		n = 1
	}
	if n > len(p.Delivered) {
		n = len(p.Delivered)
	}
	return p.Delivered[n-1]
}
