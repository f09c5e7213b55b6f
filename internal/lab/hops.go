package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/sim"
)

// HopRelayResult is the hop-relay scenario measured on Rialto's block data
// plane: the median 4 KiB read round trip through 0..MaxHops relays, and
// what a relay adds to a plain TCP ping through the same number of relays
// (the hop itself, characterized apart from the data plane; the slope of
// the pings' medians over the number of relays).
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
// in series, each delaying every byte by spec.Delay each way, and pings an
// echo server through as many relays, in rounds; reads is the number of
// rounds (default 60).
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

	e, err := startEcho(ctx)
	if err != nil {
		return HopRelayResult{}, err
	}
	defer e.Close()
	// One chain of h relays to the export and one to an echo server for
	// each h, open for the whole run; every round times one 4 KiB read and
	// one 32-byte ping through each, so that the machine's load, which
	// moves in seconds, touches the reads and the pings alike.
	hop := Hop{Delay: spec.Delay}
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	type path struct {
		nc   *nbd.Client
		ping net.Conn
	}
	paths := make([]path, spec.MaxHops+1)
	for h := range paths {
		addr, closeChain, err := Chain(ctx, ln.Addr().String(), h, hop)
		if err != nil {
			return HopRelayResult{}, err
		}
		closers = append(closers, closeChain)
		if paths[h].nc, err = nbd.Dial(ctx, "tcp", addr, name); err != nil {
			return HopRelayResult{}, fmt.Errorf("lab: %d relays: %w", h, err)
		}
		closers = append(closers, func() { paths[h].nc.Close() })
		paddr, closePing, err := Chain(ctx, e.Addr(), h, hop)
		if err != nil {
			return HopRelayResult{}, err
		}
		closers = append(closers, closePing)
		var d net.Dialer
		if paths[h].ping, err = d.DialContext(ctx, "tcp", paddr); err != nil {
			return HopRelayResult{}, fmt.Errorf("lab: ping: %w", err)
		}
		closers = append(closers, func() { paths[h].ping.Close() })
	}
	buf := make([]byte, 4096)
	msg, back := make([]byte, 32), make([]byte, 32)
	reads2 := make([][]time.Duration, len(paths))
	pings := make([][]time.Duration, len(paths))
	for i := -3; i < reads; i++ { // three rounds warm the connections up
		for h, p := range paths {
			t0 := time.Now()
			if _, err := p.nc.ReadAtContext(ctx, buf, int64((i+3)%(size/4096))*4096); err != nil {
				return HopRelayResult{}, fmt.Errorf("lab: %d relays: %w", h, err)
			}
			rt := time.Since(t0)
			if dl, ok := ctx.Deadline(); ok {
				_ = p.ping.SetDeadline(dl)
			}
			t0 = time.Now()
			if _, err := p.ping.Write(msg); err != nil {
				return HopRelayResult{}, fmt.Errorf("lab: ping: %w", err)
			}
			if _, err := io.ReadFull(p.ping, back); err != nil {
				return HopRelayResult{}, fmt.Errorf("lab: ping: %w", err)
			}
			pt := time.Since(t0)
			if i >= 0 {
				reads2[h], pings[h] = append(reads2[h], rt), append(pings[h], pt)
			}
		}
	}
	med := func(xs []time.Duration) time.Duration {
		sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
		return xs[len(xs)/2]
	}
	var res, ping HopRelayResult
	for h := range paths {
		res.Median = append(res.Median, med(reads2[h]))
		ping.Median = append(ping.Median, med(pings[h]))
	}
	res.Hop = ping.PerHop()
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
		note := fmt.Sprintf("a relay adds %v to a TCP ping timed in the same rounds; median 4 KiB NBD read %v with no relay", m.Hop.Round(time.Microsecond), m.Median[0].Round(time.Microsecond))
		ok := setReal(res, "round trip added per relay hop", sim.Real{Value: float64(m.PerHop().Microseconds()), Sim: hop, Tolerance: 0.1, Note: note})
		ok = setReal(res, fmt.Sprintf("round trip added by %d relay hops", spec.MaxHops), sim.Real{Value: float64(m.Added(spec.MaxHops).Microseconds()), Sim: float64(spec.MaxHops) * hop, Tolerance: 0.1}) && ok
		if !ok {
			return errors.New("lab: hop-relay: the experiment's metrics changed")
		}
		return nil
	}
}
