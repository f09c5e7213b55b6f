package sim

import (
	"math"

	"github.com/rialto-project/rialto/internal/placement"
)

// Interference is the simulator's block-device model: a device that writes
// Max bytes/s to one sequential stream and, with n concurrent streams,
// delivers
//
//	delivered(n) = Max / (1 + Alpha·(n−1))
//
// in aggregate: every further stream it interleaves costs a fixed share of
// its time (seeks in the flash translation layer, smaller bursts). A
// composition of k devices is k such devices, each seeing every stream
// striped over it. One parameter, so that the data of a single device can
// fix it and the compositions are predicted, not fitted.
type Interference struct {
	Max, Alpha float64
}

// Delivered is the aggregate bandwidth with n concurrent streams.
func (m Interference) Delivered(n int) float64 {
	if n < 1 {
		n = 1
	}
	return m.Max / (1 + m.Alpha*float64(n-1))
}

// ProfileStreams is how many concurrency levels Profile tabulates (beyond
// it the last entry holds).
const ProfileStreams = 64

// Profile is the model as a placement profile (delivered bandwidth for
// 1..ProfileStreams streams): what placement predicts with and what the
// simulator's devices deliver.
func (m Interference) Profile(model string) placement.Profile {
	p := placement.Profile{Model: model, MaxBandwidth: m.Max}
	for n := 1; n <= ProfileStreams; n++ {
		p.Delivered = append(p.Delivered, m.Delivered(n))
	}
	return p
}

// FitInterference returns the values of α under which one device of max
// bytes/s serves holds writers of rate bytes/s each without degradation
// (each keeps at least rate/(1+tol)) but not holds+1 — the only thing the
// one-device threshold says — and the geometric middle of that interval,
// the point estimate. holds must be at least 1.
func FitInterference(max, rate float64, holds int, tol float64) (lo, hi, mid float64) {
	// Writer slowdown with n writers: n·rate/delivered(n); degraded above 1+tol.
	bound := func(n int) float64 { // largest α that keeps n writers undegraded
		if n == 1 {
			return math.Inf(1)
		}
		return (max*(1+tol)/(float64(n)*rate) - 1) / float64(n-1)
	}
	hi, lo = bound(holds), bound(holds+1)
	if lo < 0 {
		lo = 0
	}
	mid = math.Sqrt(lo * hi)
	if math.IsInf(hi, 1) {
		mid = 2 * lo
	}
	return lo, hi, mid
}

// CallNVMe is the device of Call et al. predicted from one device's data
// alone: 2 GB/s sequential writes, writers of 477 MB/s, and sharing one
// device degrades at 3 writers (Fig. 6(a)). Compositions, Fig. 7 and Fig. 8
// are predicted from it.
var CallNVMe, CallNVMeAlpha = func() (Interference, [2]float64) {
	lo, hi, mid := FitInterference(fig("call/device-write"), fig("call/instance-rate"), int(fig("call/fig6-1dev"))-1, placement.SlowdownTolerance)
	return Interference{Max: fig("call/device-write"), Alpha: mid}, [2]float64{lo, hi}
}()

// CallNVMeModel is the profile key of CallNVMe in snapshots.
const CallNVMeModel = "call-nvme"
