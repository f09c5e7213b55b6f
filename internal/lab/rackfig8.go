package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/characterize"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/placement"
	"github.com/rialto-project/rialto/internal/rack"
	"github.com/rialto-project/rialto/internal/sim"
)

// RackFig8Config runs the Fig. 8 layouts on an emulated rack.
type RackFig8Config struct {
	Binary   string // the rialto binary (required)
	StateDir string // the rack's state directory ("": a temporary one, removed after)
	Spec     sim.RackFig8Spec
	Logger   *slog.Logger
}

// RackFig8Result is what the layouts measured: per layout, each writer's
// bytes over its own elapsed time; the devices' characterized write profile
// (delivered aggregate bytes/s for 1..5 streams, one connection); and the
// simulator's per-writer prediction from that profile.
type RackFig8Result struct {
	Real, Sim map[string][]float64
	Profile   []float64
	LinksBusy map[string]float64 // the busiest device link's use over the layout's makespan
}

// MaxError is the largest |sim − real| / real over every writer of every
// layout.
func (r RackFig8Result) MaxError() float64 {
	m := 0.0
	for l, rs := range r.Real {
		for i, v := range rs {
			m = math.Max(m, math.Abs(r.Sim[l][i]-v)/v)
		}
	}
	return m
}

// rackQueue is the links' tbf queue at rate bits/s: 1.25 MB, with TCP Reno,
// where real flows through one FIFO share it as the simulator's do (see the
// writers lab, DefaultQueueBytes).
func rackQueue(rate float64) string {
	return strconv.FormatInt(int64(DefaultQueueBytes*8*1000/rate), 10) + "ms"
}

// RunRackFig8 starts a rack of two agents with one disk each, whose links
// tbf shapes at cfg.Spec.LinkRate; characterizes one disk through the data
// plane (a whole-device lease, characterize.Measure: what `rialto
// characterize` runs) and stores the profile for the disks' model; then, for
// each layout of Fig. 8, creates five leases through the API (pinned to the
// layout's devices: shared on one, composed over both, whole-device
// dedicated), writes cfg.Spec.Bytes through each from the root namespace at
// once, and releases them. It needs root (rack.Available).
func RunRackFig8(ctx context.Context, cfg RackFig8Config) (res RackFig8Result, err error) {
	if err := rack.Available(); err != nil {
		return res, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StateDir == "" {
		dir, err := os.MkdirTemp("", "rialto-rack-fig8-")
		if err != nil {
			return res, fmt.Errorf("lab: %w", err)
		}
		defer os.RemoveAll(dir)
		cfg.StateDir = dir
	}
	spec := cfg.Spec
	rate := strconv.FormatInt(int64(spec.LinkRate), 10) + "bit"
	r, err := rack.Start(ctx, rack.Config{Binary: cfg.Binary, StateDir: cfg.StateDir, Agents: 2, Disks: 1, DiskSize: 256 << 20,
		LinkRate: rate, Queue: rackQueue(spec.LinkRate), CongestionControl: DefaultCongestionControl, Logger: cfg.Logger,
		// The figure is about links shared by NBD streams, as measured
		// before the data planes had TLS: keep them plaintext.
		InsecureDataplane: true})
	if err != nil {
		return res, fmt.Errorf("lab: rack: %w", err)
	}
	defer func() {
		if cerr := r.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("lab: rack: %w", cerr)
		}
	}()
	c := r.Client()
	var disks []api.Device
	for deadline := time.Now().Add(30 * time.Second); len(disks) < 2; {
		devs, err := c.Devices(ctx)
		if err != nil {
			return res, err
		}
		disks = disks[:0]
		for _, d := range devs {
			if d.Kind == api.KindBlock && d.State == "available" {
				disks = append(disks, d)
			}
		}
		if len(disks) < 2 && time.Now().After(deadline) {
			return res, fmt.Errorf("lab: the rack lends %d block devices, want 2", len(disks))
		}
		if len(disks) < 2 {
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	if disks[0].NodeID > disks[1].NodeID {
		disks[0], disks[1] = disks[1], disks[0]
	}

	// Characterize one disk (both are alike) through a whole-device lease.
	prof, err := characterizeDisk(ctx, c, disks[0])
	if err != nil {
		return res, err
	}
	res.Profile = prof.WriteBps
	p := placement.Profile{Model: "rack-disk", MaxBandwidth: prof.WriteBps[0], Delivered: prof.WriteBps}
	res.Sim, _ = sim.Fig8Rates(p, spec.Bytes)

	res.Real = map[string][]float64{}
	res.LinksBusy = map[string]float64{}
	for _, l := range sim.Fig8Layouts {
		rates, busy, err := runLayout(ctx, r, disks, l.Name, l.Devices, spec)
		if err != nil {
			return res, fmt.Errorf("lab: layout (%s): %w", l.Name, err)
		}
		res.Real[l.Name], res.LinksBusy[l.Name] = rates, busy
	}
	return res, nil
}

func characterizeDisk(ctx context.Context, c *api.Client, d api.Device) (api.Profile, error) {
	l, err := c.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Whole: true, Affinity: []string{d.ID}})
	if err != nil {
		return api.Profile{}, fmt.Errorf("lab: characterizing lease: %w", err)
	}
	defer func() { _, _ = c.ReleaseLease(context.WithoutCancel(ctx), l.ID) }()
	nc, err := nbd.DialURI(ctx, l.URI)
	if err != nil {
		return api.Profile{}, fmt.Errorf("lab: characterizing: %w", err)
	}
	defer nc.Close()
	model := d.Model
	if model == "" {
		model = "rack-disk"
	}
	// Twice, keeping each step's larger figure: on a loaded machine the
	// CPU only ever lowers a step (a shaped link delivers no more than its
	// rate), and one step starved for a moment would otherwise be taken
	// for the device's behaviour at that concurrency.
	var prof api.Profile
	for range 2 {
		p, err := characterize.Measure(ctx, nc, characterize.Options{MaxStreams: 5, BytesPerStep: 3 << 20, RequestSize: 128 << 10, LatencyOps: 20, Model: model})
		if err != nil {
			return p, err
		}
		prof = maxProfile(prof, p)
	}
	// Store it as `rialto characterize` does: placement predicts with it.
	if _, err := c.PutProfile(ctx, prof); err != nil {
		return prof, fmt.Errorf("lab: storing the profile: %w", err)
	}
	return prof, nil
}

// runLayout creates the layout's five leases, writes through them at once
// and returns each writer's bandwidth and how busy the busiest device link
// was (bytes its tbf sent over what it could send in the makespan).
func runLayout(ctx context.Context, r *rack.Rack, disks []api.Device, name string, devices func(i int) []int, spec sim.RackFig8Spec) ([]float64, float64, error) {
	c := r.Client()
	var leases []api.Lease
	defer func() {
		for _, l := range leases {
			_, _ = c.ReleaseLease(context.WithoutCancel(ctx), l.ID)
		}
	}()
	size := int64(spec.Bytes) + 4<<20
	for i := 0; i < 5; i++ {
		ds := devices(i)
		req := api.LeaseRequest{Kind: api.KindBlock, Size: size}
		for _, d := range ds {
			req.Affinity = append(req.Affinity, disks[d].ID)
		}
		switch {
		case len(ds) > 1:
			req.Mode, req.Count = api.ModeComposed, len(ds)
		case name == "c" && i == 0:
			req.Whole, req.Size = true, 0
		default:
			req.Mode = api.ModeShared
		}
		l, err := c.CreateLease(ctx, req)
		if err != nil {
			return nil, 0, fmt.Errorf("lease %d: %w", i+1, err)
		}
		leases = append(leases, l)
		if len(l.Parts) != len(ds) {
			return nil, 0, fmt.Errorf("lease %d has %d parts, want %d", i+1, len(l.Parts), len(ds))
		}
	}
	vols := make([]*stripe.Volume, len(leases))
	var clients []*nbd.Client
	defer func() {
		for _, nc := range clients {
			nc.Close()
		}
	}()
	for i, l := range leases {
		var devs []stripe.Device
		for _, p := range l.Parts {
			uri := p.URI
			if uri == "" {
				uri = l.URI
			}
			nc, err := nbd.DialURI(ctx, uri)
			if err != nil {
				return nil, 0, fmt.Errorf("lease %d: %w", i+1, err)
			}
			clients = append(clients, nc)
			devs = append(devs, nc)
		}
		v, err := stripe.New(devs, stripe.Config{StripeUnit: l.StripeUnit})
		if err != nil {
			return nil, 0, err
		}
		vols[i] = v
	}
	sent0, err := rackSent(r)
	if err != nil {
		return nil, 0, err
	}
	wcfg := WritersConfig{}
	wcfg.defaults()
	pattern := newPattern(wcfg.Request)
	bytes := int64(spec.Bytes)
	rates := make([]float64, len(vols))
	errs := make([]error, len(vols))
	start := make(chan struct{})
	var wg sync.WaitGroup
	var t0 time.Time
	for i, v := range vols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var done atomic.Int64
			errs[i] = writeSeq(ctx, v, bytes, pattern, wcfg, &done)
			rates[i] = float64(bytes) / time.Since(t0).Seconds()
		}()
	}
	t0 = time.Now()
	close(start)
	wg.Wait()
	makespan := time.Since(t0).Seconds()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	sent1, err := rackSent(r)
	if err != nil {
		return nil, 0, err
	}
	busy := 0.0
	for i := range sent0 {
		busy = math.Max(busy, float64(sent1[i]-sent0[i])/(spec.LinkRate/8*makespan))
	}
	return rates, busy, nil
}

// rackSent returns the bytes each agent's link has carried towards it.
func rackSent(r *rack.Rack) ([]int64, error) {
	var out []int64
	for _, a := range r.Agents() {
		n, err := r.Counters(a)
		if err != nil {
			return nil, err
		}
		out = append(out, n.ToHost)
	}
	return out, nil
}

func init() {
	counterparts["rack-fig8"] = func(ctx context.Context, res *sim.Result) error {
		if err := rack.Available(); err != nil {
			res.Notes = append(res.Notes, "real counterpart not run: "+err.Error())
			return nil
		}
		bin, err := os.Executable()
		if err != nil {
			return err
		}
		m, err := RunRackFig8(ctx, RackFig8Config{Binary: bin, Spec: sim.DefaultRackFig8})
		if err != nil {
			return err
		}
		for _, g := range sim.RackFig8Groups {
			real := sim.GroupMean(m.Real[g.Layout], g.Writers)
			worst := 0.0
			for _, w := range g.Writers {
				worst = math.Max(worst, math.Abs(m.Sim[g.Layout][w]-m.Real[g.Layout][w])/m.Real[g.Layout][w])
			}
			if !setReal(res, g.Metric, sim.Real{Value: real / 1e6, Sim: sim.GroupMean(m.Sim[g.Layout], g.Writers) / 1e6, Tolerance: 0.1,
				Note: fmt.Sprintf("worst lease %.1f%% off; device characterized at %.2f MB/s", 100*worst, m.Profile[0]/1e6)}) {
				return errors.New("lab: rack-fig8: the experiment's metrics changed")
			}
		}
		return nil
	}
}

// maxProfile is p with each step of its write and read figures the larger
// of a's and p's (a zero a: p).
func maxProfile(a, p api.Profile) api.Profile {
	if len(a.WriteBps) == 0 {
		return p
	}
	for i := range p.WriteBps {
		if i < len(a.WriteBps) {
			p.WriteBps[i] = max(p.WriteBps[i], a.WriteBps[i])
		}
	}
	for i := range p.ReadBps {
		if i < len(a.ReadBps) {
			p.ReadBps[i] = max(p.ReadBps[i], a.ReadBps[i])
		}
	}
	return p
}
