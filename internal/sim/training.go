package sim

import (
	"time"

	"github.com/rialto-project/rialto/internal/fabric"
)

// TrainingSpec is a data-parallel training job on GPUs (the Device Lending
// paper's Keras VGG19 transfer learning): every step each GPU reads a batch from an NVMe
// drive, computes, and then the GPUs exchange gradients peer to peer (each
// reads the other's buffer).
type TrainingSpec struct {
	GPUs      int
	Steps     int
	Batch     float64 // bytes read from NVMe per GPU per step
	Compute   Time    // seconds of GPU compute per step
	Gradients float64 // bytes each GPU reads from its peer per step
}

// DefaultTraining: 2 GPUs, 50 steps of 64 images (9.6 MB), 250 ms compute,
// 80 MB of trainable-layer gradients.
var DefaultTraining = TrainingSpec{GPUs: 2, Steps: 50, Batch: 9.6e6, Compute: 0.25, Gradients: 80e6}

// TrainingPath describes where the devices are: whether they are borrowed
// (their traffic crosses lender NTB links) and whether peer-to-peer reads go
// through a CPU root (IOMMU on), which splits reads into 64 B requests.
type TrainingPath struct {
	Name        string
	Remote      bool
	ThroughRoot bool
}

// pcie3x16 is a PCIe 3.0 x16 link's usable bandwidth in bytes/s.
const pcie3x16 = 12e9

// RunTraining runs the job and returns its duration.
func RunTraining(spec TrainingSpec, p TrainingPath) (Time, uint64) {
	var e Engine
	net := NewNet(&e)
	// Links: the NVMe's and each GPU's upstream port; when borrowed, the
	// lender's NTB link too (shared by everything the lender serves).
	nvme := &Resource{Name: "nvme", Capacity: 3e9}
	gpus := make([]*Resource, spec.GPUs)
	for i := range gpus {
		gpus[i] = &Resource{Name: "gpu-port", Capacity: pcie3x16}
	}
	var ntb *Resource
	rtt := 1 * time.Microsecond
	if p.Remote {
		ntb = &Resource{Name: "ntb", Capacity: pcie3x16}
		rtt += 2 * fabric.NTBLatency(1)
	}
	const tags = 32 // outstanding read requests of a GPU's DMA engine
	readCap := fabric.DirectReadBandwidth(pcie3x16, tags, rtt)
	if p.ThroughRoot {
		readCap = fabric.RootReadBandwidth(pcie3x16, tags, rtt+200*time.Nanosecond)
	}
	path := func(rs ...*Resource) []*Resource {
		if ntb != nil {
			rs = append(rs, ntb)
		}
		return rs
	}
	step := 0
	var run func()
	run = func() {
		if step == spec.Steps {
			return
		}
		step++
		// Load: every GPU reads its batch from the NVMe (NVMe DMA writes
		// into GPU memory: posted writes, not split).
		left := spec.GPUs
		for i := range gpus {
			net.Start(spec.Batch, path(nvme, gpus[i]), 0, func(*Flow) {
				if left--; left > 0 {
					return
				}
				e.After(spec.Compute, func() {
					// Exchange: each GPU reads its peer's gradients.
					left := spec.GPUs
					for i := range gpus {
						peer := gpus[(i+1)%spec.GPUs]
						net.Start(spec.Gradients, path(gpus[i], peer), readCap, func(*Flow) {
							if left--; left == 0 {
								run()
							}
						})
					}
				})
			})
		}
	}
	e.At(0, run)
	e.Run(0)
	return e.Now(), e.Events()
}
