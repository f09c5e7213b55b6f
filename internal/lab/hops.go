package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/sim"
)

// HopRelayResult is the hop-relay scenario measured on Rialto's block data
// plane: the median 4 KiB read round trip through 0..MaxHops relays, and
// what one relay adds to a plain TCP ping (the hop itself, characterized
// apart from the data plane).
type HopRelayResult struct {
	Median []time.Duration // by number of relays
	Hop    time.Duration
}

// Added is the median round trip h relays added over none.
func (r HopRelayResult) Added(h int) time.Duration { return r.Median[h] - r.Median[0] }

// PerHop is the least-squares slope of the median round trip over the
// number of relays.
func (r HopRelayResult) PerHop() time.Duration {
	n := float64(len(r.Median))
	var sx, sy, sxx, sxy float64
	for h, m := range r.Median {
		x, y := float64(h), float64(m)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	return time.Duration((n*sxy - sx*sy) / (n*sxx - sx*sx))
}

// RunHopRelay serves an NBD export (the data plane of a block lease) on
// loopback and reads 4 KiB at queue depth 1 through 0..spec.MaxHops relays
// in series, each delaying every byte by spec.Delay each way; reads per
// relay count (default 60).
func RunHopRelay(ctx context.Context, spec sim.HopRelaySpec, reads int) (HopRelayResult, error) {
	if reads <= 0 {
		reads = 60
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return HopRelayResult{}, fmt.Errorf("lab: %w", err)
	}
	srv := &nbd.Server{}
	name := randomName()
	const size = 16 << 20
	if err := srv.AddExport(nbd.Export{Name: name, Backend: nbd.NewMemBackend(size)}); err != nil {
		ln.Close()
		return HopRelayResult{}, err
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(sctx, ln) }()
	defer func() { stop(); ln.Close(); <-served }()

	var res HopRelayResult
	if res.Hop, err = hopRoundTrip(ctx, Hop{Delay: spec.Delay}, reads); err != nil {
		return res, err
	}
	buf := make([]byte, 4096)
	for h := 0; h <= spec.MaxHops; h++ {
		addr, closeChain, err := Chain(ctx, ln.Addr().String(), h, Hop{Delay: spec.Delay})
		if err != nil {
			return res, err
		}
		rtts, err := func() ([]time.Duration, error) {
			defer closeChain()
			c, err := nbd.Dial(ctx, "tcp", addr, name)
			if err != nil {
				return nil, err
			}
			defer c.Close()
			var out []time.Duration
			for i := 0; i < reads+5; i++ {
				t0 := time.Now()
				if _, err := c.ReadAtContext(ctx, buf, int64(i%(size/4096))*4096); err != nil {
					return nil, err
				}
				if i >= 5 { // the first reads warm the connection up
					out = append(out, time.Since(t0))
				}
			}
			return out, nil
		}()
		if err != nil {
			return res, fmt.Errorf("lab: %d relays: %w", h, err)
		}
		sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
		res.Median = append(res.Median, rtts[len(rtts)/2])
	}
	return res, nil
}

func init() {
	counterparts["hop-relay"] = func(ctx context.Context, res *sim.Result) error {
		spec := sim.DefaultHopRelay
		m, err := RunHopRelay(ctx, spec, 0)
		if err != nil {
			return err
		}
		// The model, fed with the hop as a ping measured it, predicts what
		// the block data plane's round trip gains per relay.
		hop := float64(m.Hop.Microseconds())
		note := fmt.Sprintf("a relay adds %v to a TCP ping; median 4 KiB NBD read %v with no relay", m.Hop.Round(time.Microsecond), m.Median[0].Round(time.Microsecond))
		ok := setReal(res, "round trip added per relay hop", sim.Real{Value: float64(m.PerHop().Microseconds()), Sim: hop, Tolerance: 0.1, Note: note})
		ok = setReal(res, fmt.Sprintf("round trip added by %d relay hops", spec.MaxHops), sim.Real{Value: float64(m.Added(spec.MaxHops).Microseconds()), Sim: float64(spec.MaxHops) * hop, Tolerance: 0.1}) && ok
		if !ok {
			return errors.New("lab: hop-relay: the experiment's metrics changed")
		}
		return nil
	}
}
