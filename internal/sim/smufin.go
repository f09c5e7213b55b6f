package sim

// Volume is what a block lease gives a workload: one path per stripe member
// (a dedicated or shared device is one member; a composition of k devices is
// k members, written evenly, RAID0-like).
type Volume struct {
	Members [][]*Resource
}

// SmufinSpec describes a SMUFIN-like sequential writer (the merge stage of
// the NVMe-oF genomics paper, Call et al.). Its writes interleave with compute so finely that, at the time
// scale of a run, it is a stream that never asks for more than Rate (the
// average it reaches alone on one device): it is slowed only when its share
// of the device or the fabric falls below Rate.
type SmufinSpec struct {
	Bytes float64 // bytes written per instance (paper: ~150 GB)
	Rate  float64 // bytes/s alone on one device (paper: 477 MB/s)
	// Chunks splits the write into that many consecutive steps (progress
	// reporting and placement of late arrivals see partial progress). 0 means 1.
	Chunks int
}

// DefaultSmufin is the paper's instance scaled down 100× in bytes (1.5 GB)
// with the paper's rate, so every ratio is preserved.
var DefaultSmufin = SmufinSpec{Bytes: fig("call/instance-bytes") / 100, Rate: fig("call/instance-rate"), Chunks: 1}

// AloneTime is the run time alone on one device.
func (s SmufinSpec) AloneTime() Time { return s.Bytes / s.Rate }

// SmufinInstance is one running writer.
type SmufinInstance struct {
	Spec   SmufinSpec
	Vol    Volume
	Start  Time
	End    Time
	Done   bool
	chunk  int
	eng    *Engine
	net    *Net
	onDone func(*SmufinInstance)
}

// StartSmufin starts a writer now on vol; onDone runs when it has written
// everything.
func StartSmufin(eng *Engine, net *Net, spec SmufinSpec, vol Volume, onDone func(*SmufinInstance)) *SmufinInstance {
	if spec.Chunks <= 0 {
		spec.Chunks = 1
	}
	w := &SmufinInstance{Spec: spec, Vol: vol, Start: eng.Now(), eng: eng, net: net, onDone: onDone}
	w.step()
	return w
}

// Slowdown is the run time relative to running alone on one device.
func (w *SmufinInstance) Slowdown() float64 { return (w.End - w.Start) / w.Spec.AloneTime() }

func (w *SmufinInstance) step() {
	if w.chunk == w.Spec.Chunks {
		w.Done = true
		w.End = w.eng.Now()
		if w.onDone != nil {
			w.onDone(w)
		}
		return
	}
	w.chunk++
	k := float64(len(w.Vol.Members))
	b := w.Spec.Bytes / float64(w.Spec.Chunks) / k
	left := len(w.Vol.Members)
	for _, path := range w.Vol.Members {
		w.net.Start(b, path, w.Spec.Rate/k, func(*Flow) {
			left--
			if left == 0 {
				w.step()
			}
		})
	}
}
