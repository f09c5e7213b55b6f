package lab

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/sim"
)

// RunQPair runs the queue-pair scenario on Rialto's memory data plane: a
// donor on loopback grants spec.Window credits per queue pair; the client
// reaches it through a relay that paces its data connections at spec.Rate
// with spec.Delay each way and delays its control connection — which
// carries the credit updates — by spec.CreditDelay each way; the client
// posts spec.Ops writes of spec.OpBytes on a queue pair. It returns the
// share of the link's rate the writes used in steady state: spec.Window
// writes per credit loop, the time from a write's post to the post its
// credit lets go (the spec.Window-th after it), past the first tenth, the
// loop taken undisturbed (its 10th percentile: a loaded machine's
// scheduler only ever lengthens a loop, in a busy second many of them,
// while the credits and the link set its shortest). With spec.Rate 0
// there is no relay (the client dials the donor) and it returns the
// seconds per write instead, likewise undisturbed.
func RunQPair(ctx context.Context, spec sim.QPairSpec) (float64, error) {
	d := donor.New(nil)
	d.Credits = spec.Window
	cred := randomName()
	size := int64(spec.OpBytes) * 64
	if err := d.AddRegion(cred, size); err != nil {
		return 0, fmt.Errorf("lab: donor: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("lab: %w", err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { defer close(served); _ = d.Serve(sctx, ln) }()
	defer func() { stop(); ln.Close(); <-served }()

	// The first frame of every connection is a HELLO whose payload starts
	// with the connection's kind: the control connection gets the credit
	// path, every other one the shaped data link.
	relay, err := StartRelay(ctx, RelayConfig{Target: ln.Addr().String(), Peek: protocol.HeaderSize + 1,
		Hop: Hop{Delay: spec.Delay, Rate: spec.Rate},
		Classify: func(first []byte) Hop {
			if first[protocol.HeaderSize] == protocol.KindControl {
				return Hop{Delay: spec.CreditDelay}
			}
			return Hop{Delay: spec.Delay, Rate: spec.Rate}
		}})
	if err != nil {
		return 0, err
	}
	defer relay.Close()
	addr := relay.Addr()
	if spec.Rate == 0 {
		addr = ln.Addr().String()
	}
	c, err := client.Dial(ctx, addr, cred, client.Options{Timeout: 30 * time.Second, Streams: 1})
	if err != nil {
		return 0, fmt.Errorf("lab: dial the donor: %w", err)
	}
	defer c.Close()
	q, err := c.NewQueuePair(ctx)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, spec.OpBytes)
	done := make(chan error, 1)
	go func() {
		for i := 0; i < spec.Ops; i++ {
			select {
			case comp := <-q.Completions():
				if comp.Err != nil {
					done <- comp.Err
					return
				}
			case <-ctx.Done():
				done <- ctx.Err()
				return
			}
		}
		done <- nil
	}()
	// A write is posted once a credit is back: when the one the
	// spec.Window-th before it took comes back from the donor. The times
	// of the posts, not of the completions: the loop from one post to the
	// next it lets go is what the credits and the link make it, plus what
	// the machine adds, never less; the time between two completions is
	// also shortened when the first is delivered late.
	posted := make([]float64, 0, spec.Ops)
	t0 := time.Now()
	for i := 0; i < spec.Ops; i++ {
		off := int64(i%64) * int64(spec.OpBytes)
		if _, err := q.Post(ctx, client.Op{Write: true, Off: off, Buf: buf, Tag: uint64(i)}); err != nil {
			return 0, fmt.Errorf("lab: post: %w", err)
		}
		posted = append(posted, time.Since(t0).Seconds())
	}
	if err := <-done; err != nil {
		return 0, err
	}
	w := max(spec.Window, 1)
	var loops []float64
	for i := len(posted) / 10; i+w < len(posted); i++ {
		loops = append(loops, posted[i+w]-posted[i])
	}
	if len(loops) == 0 {
		return 0, errors.New("lab: too few writes to measure")
	}
	loop := undisturbed(loops)
	if spec.Rate == 0 {
		return loop / float64(w), nil
	}
	return math.Min(1, float64(w*spec.OpBytes)/loop/spec.Rate), nil
}

// MeasuredQPair is spec with the one-way delays its relays actually
// deliver on this machine, undisturbed (hopOneWay), which the simulator
// then runs as the scenario that ran: the data relay's for a message of a
// write's size (its pieces paced at the link's rate, each on a timer of
// its own, as a write's), the credit relay's for a small one (as a credit
// update).
func MeasuredQPair(ctx context.Context, spec sim.QPairSpec) (sim.QPairSpec, error) {
	data, err := hopOneWay(ctx, Hop{Delay: spec.Delay, Rate: spec.Rate}, 20, spec.OpBytes)
	if err != nil {
		return spec, err
	}
	credit, err := hopOneWay(ctx, Hop{Delay: spec.CreditDelay}, 20, creditBytes)
	if err != nil {
		return spec, err
	}
	// The data relay also serialises the message at the link's rate:
	// take that out, the model adds it per write.
	spec.Delay = data - seconds(float64(spec.OpBytes)/spec.Rate)
	spec.CreditDelay = credit
	// The ends' own cost per write: one credit, no relay, so every write
	// waits for the previous one's credit.
	direct := spec
	direct.Window, direct.Rate, direct.Delay, direct.CreditDelay, direct.Ops = 1, 0, 0, 0, 100
	per, err := RunQPair(ctx, direct)
	if err != nil {
		return spec, err
	}
	spec.Service = seconds(per)
	return spec, nil
}

// creditBytes is about the size of a credit update on the wire.
const creditBytes = 32

// QPairMeasurement is the queue-pair scenario measured with fast and slow
// credits, and the simulator's prediction for the links as measured.
type QPairMeasurement struct {
	Fast, Slow       float64
	SimFast, SimSlow float64
}

// MeasureQPair runs the scenario with spec's credit path and with it
// SlowCredits slower, characterizing the relays before each run.
func MeasureQPair(ctx context.Context, spec sim.QPairSpec) (QPairMeasurement, error) {
	var m QPairMeasurement
	slowSpec := spec
	slowSpec.CreditDelay += sim.SlowCredits
	for _, x := range []struct {
		spec     sim.QPairSpec
		real, sm *float64
	}{{spec, &m.Fast, &m.SimFast}, {slowSpec, &m.Slow, &m.SimSlow}} {
		ms, err := MeasuredQPair(ctx, x.spec)
		if err != nil {
			return m, err
		}
		*x.sm, _ = sim.QPairUtilisation(ms)
		if *x.real, err = RunQPair(ctx, x.spec); err != nil {
			return m, err
		}
	}
	return m, nil
}

func init() {
	counterparts["qpair-credits"] = func(ctx context.Context, res *sim.Result) error {
		m, err := MeasureQPair(ctx, sim.DefaultQPair)
		if err != nil {
			return err
		}
		fast, slow := m.Fast, m.Slow
		ok := setReal(res, "utilisation, credits on the fast path", sim.Real{Value: fast, Sim: m.SimFast, Tolerance: 0.1})
		ok = setReal(res, "utilisation, credits delayed", sim.Real{Value: slow, Sim: m.SimSlow, Tolerance: 0.1}) && ok
		ok = setReal(res, "fast credits raise utilisation (1 = yes)", sim.Real{Value: b2f(fast > 1.1*slow), Note: fmt.Sprintf("×%.2f measured", fast/slow)}) && ok
		if !ok {
			return errors.New("lab: qpair-credits: the experiment's metrics changed")
		}
		return nil
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
