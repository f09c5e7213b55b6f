package sim

import (
	"context"
	"fmt"

	"github.com/rialto-project/rialto/internal/placement"
)

func init() {
	register("rack-fig8", after("call", "Fig. 8"), "the layouts (a), (b), (c) of five writers on two rate-limited devices of the emulated rack (internal/rack), per lease, simulated from the devices' characterized profile and measured with real agents (--real, root)", runRackFig8)
}

// WireEfficiency is the share of a tc tbf link's rate left for NBD payload:
// tbf counts whole Ethernet frames (1,514 bytes for a full 1,500-byte MTU
// segment) of which 1,448 are TCP payload (IPv4 20 B, TCP 20 B + 12 B of
// timestamps); NBD's 28-byte request header per 1 MiB is negligible.
const WireEfficiency = 1448.0 / 1514.0

// RackFig8Spec is the emulated-rack version of Fig. 8: two agents, one
// device each, whose links tbf shapes at LinkRate bits/s (the devices'
// bandwidth as the borrower sees it); five writers each write Bytes as fast
// as they can.
type RackFig8Spec struct {
	LinkRate float64 // bits/s
	Bytes    float64
}

// DefaultRackFig8: 40 Mbit/s per device (the real writers then need a few
// MB/s, far below what the machine's data plane moves, so the links bound
// them, not the CPU), 4 MiB per writer.
var DefaultRackFig8 = RackFig8Spec{LinkRate: 40e6, Bytes: 4 << 20}

// NominalProfile is a device that delivers rate bytes/s whatever the
// number of streams: a tbf-shaped link before it is characterized.
func NominalProfile(rate float64) placement.Profile {
	return placement.Profile{Model: "rack-disk", MaxBandwidth: rate, Delivered: []float64{rate}}
}

// Fig8Layouts are the writers' devices in each layout of Fig. 8 (two
// devices, five writers).
var Fig8Layouts = []struct {
	Name, Label string
	Devices     func(i int) []int // indices of the devices writer i stripes over
}{
	{"a", "(a) 1 shared device", func(int) []int { return []int{0} }},
	{"b", "(b) 2-device composition", func(int) []int { return []int{0, 1} }},
	{"c", "(c) 1 dedicated + 4 shared", func(i int) []int {
		if i == 0 {
			return []int{0}
		}
		return []int{1}
	}},
}

// Fig8Rates predicts each writer's bandwidth (its bytes over its own
// elapsed time) in each layout, for two devices of profile p and writers
// that write bytes each, striped evenly over their devices, with no rate of
// their own to keep.
func Fig8Rates(p placement.Profile, bytes float64) (map[string][]float64, uint64) {
	out := map[string][]float64{}
	var events uint64
	for _, l := range Fig8Layouts {
		var e Engine
		net := NewNet(&e)
		devs := make([]*Resource, 2)
		for i := range devs {
			devs[i] = &Resource{Name: fmt.Sprintf("disk%d", i)}
			devs[i].Capacity, devs[i].Profile = ProfileTable(p)
		}
		rates := make([]float64, 5)
		for w := 0; w < 5; w++ {
			ds := l.Devices(w)
			left := len(ds)
			for _, d := range ds {
				net.Start(bytes/float64(len(ds)), []*Resource{devs[d]}, 0, func(*Flow) {
					if left--; left == 0 {
						rates[w] = bytes / e.Now()
					}
				})
			}
		}
		e.Run(0)
		out[l.Name] = rates
		events += e.Events()
	}
	return out, events
}

// RackFig8Groups are the figures rack-fig8 reports: the mean bandwidth of
// the writers of one kind in one layout (writer indices within the layout).
var RackFig8Groups = []struct {
	Metric, Layout string
	Writers        []int
}{
	{"(a) writer sharing 1 device", "a", []int{0, 1, 2, 3, 4}},
	{"(b) writer on the 2-device composition", "b", []int{0, 1, 2, 3, 4}},
	{"(c) dedicated writer", "c", []int{0}},
	{"(c) writer sharing the other device", "c", []int{1, 2, 3, 4}},
}

// GroupMean is the mean of rates over writers.
func GroupMean(rates []float64, writers []int) float64 {
	s := 0.0
	for _, w := range writers {
		s += rates[w]
	}
	return s / float64(len(writers))
}

func runRackFig8(ctx context.Context, o Options) (Result, error) {
	spec := DefaultRackFig8
	rate := spec.LinkRate / 8 * WireEfficiency
	pred, ev := Fig8Rates(NominalProfile(rate), spec.Bytes)
	r := Result{Events: ev, Header: []string{"layout", "writer", "MBps"}}
	r.Plot = Plot{Title: "Fig. 8 layouts on the emulated rack: per-writer bandwidth", YLabel: "MB/s", Categories: []string{"writer 1", "2", "3", "4", "5"}}
	for _, l := range Fig8Layouts {
		s := Series{Name: l.Label}
		for w, v := range pred[l.Name] {
			r.Rows = append(r.Rows, []string{l.Name, itoa(w + 1), ftoa(v / 1e6)})
			s.X, s.Y = append(s.X, float64(w)), append(s.Y, v/1e6)
		}
		r.Plot.Series = append(r.Plot.Series, s)
	}
	for _, g := range RackFig8Groups {
		r.Metrics = append(r.Metrics, Metric{Name: g.Metric, Value: GroupMean(pred[g.Layout], g.Writers) / 1e6, Unit: "MB/s", Kind: Prediction})
	}
	r.Notes = append(r.Notes, fmt.Sprintf("two devices whose links tbf shapes at %.0f Mbit/s (%.2f MB/s of NBD payload, the same for any number of streams until characterized), five writers of %.0f MiB each",
		spec.LinkRate/1e6, rate/1e6, spec.Bytes/(1<<20)),
		"--real (root): an emulated rack of two `rialto agent` processes in network namespaces, the devices characterized through the data plane (the profile `rialto characterize` stores), the leases created through the API with the layouts' pins, and five writers in the root namespace; the real figure is compared with the model fed the characterized profile, per lease")
	return r, ctx.Err()
}
