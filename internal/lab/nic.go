package lab

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/rack"
	"github.com/rialto-project/rialto/internal/sim"
	"github.com/vishvananda/netlink"
)

// NICRackConfig runs the lent-NIC scenarios of the nic-efficiency and
// nic-bond experiments on an emulated rack laid out as Spec says.
type NICRackConfig struct {
	Binary   string // the rialto binary (required)
	StateDir string // the rack's state directory ("": a temporary one, removed after)
	Spec     sim.NICRackSpec
	// Sizes are the UDP payload sizes to measure the efficiency at (none:
	// skip it); Bonds the bond sizes to measure (1: one whole interface).
	Sizes, Bonds []int
	Rounds       int           // interleaved rounds (0: 1)
	Duration     time.Duration // per iperf3 run, whole seconds (0: 2 s)
	Warm         time.Duration // left out at the start and the end of each run (0: Duration/5)
	Logger       *slog.Logger
}

// NICRackResult is what the scenarios measured, medians over the rounds
// (payload bytes/s that left the lenders' uplinks, counted by the uplinks'
// own counters in the middle of each run): per size, iperf3 run on the
// first lender itself (Direct: the link used directly) and in the
// borrower through a whole-interface lease of it (Lent); per bond size,
// the bond's aggregate (Bond).
type NICRackResult struct {
	Sizes, Bonds       []int
	Direct, Lent, Bond []float64
	// DirectBusy, LentBusy and BondBusy are how busy the busiest shaped
	// link of each median run was (1: a link bounded it; clearly less:
	// the CPU did, and the run compares nothing).
	DirectBusy, LentBusy, BondBusy []float64
	// LentSegs and BondSegs are the TCP segments the tunnels sent per
	// packet in those runs (sim.Tunnel.SegmentsPerPacket).
	LentSegs, BondSegs []float64
	Runs               map[string][][]udpResult // "direct", "lent": [size][round]; "bond": [bond][round]
}

// Efficiency is Lent/Direct per size.
func (r NICRackResult) Efficiency() []float64 {
	out := make([]float64, len(r.Sizes))
	for i := range r.Sizes {
		if r.Direct[i] > 0 {
			out[i] = r.Lent[i] / r.Direct[i]
		}
	}
	return out
}

// LinkShare is Direct over what the uplink carries at each size: below
// about 0.98 the lender's own sender, not its link, bounded the direct path
// (a loaded CPU), and the efficiency compares nothing.
func (r NICRackResult) LinkShare(spec sim.NICRackSpec) []float64 {
	out := make([]float64, len(r.Sizes))
	for i, p := range r.Sizes {
		out[i] = r.Direct[i] / (spec.UplinkRate / 8 / sim.FrameCoef(p))
	}
	return out
}

// RunNICRack starts a rack of Spec.Lenders agents, each lending its uplink
// whole at its rate, and one borrower namespace, with the links' rates of
// Spec (tc tbf); then, for the efficiency, makes a lease of the first
// lender's whole interface through the API, attaches it with `rialto
// attach` in the borrower's namespace, and for each payload size, round
// after round, runs iperf3 UDP to the outside server from the lender itself
// and from the borrower; for each bond size, makes a bond lease of that
// many lenders (`count`, their whole rate), attaches it and runs
// FlowsPerLender UDP streams per lender. Each run offers 5% more than the
// uplinks carry and counts the payload that left the uplinks in its
// middle. It needs root, nft and iperf3.
func RunNICRack(ctx context.Context, cfg NICRackConfig) (res NICRackResult, err error) {
	if err := rack.Available(); err != nil {
		return res, err
	}
	for _, tool := range []string{"nft", "iperf3"} {
		if _, err := exec.LookPath(tool); err != nil {
			return res, fmt.Errorf("lab: %s not installed", tool)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 1
	}
	// iperf3 runs for whole seconds.
	cfg.Duration = max(cfg.Duration.Round(time.Second), time.Second)
	if cfg.Duration <= time.Second {
		cfg.Duration = 2 * time.Second
	}
	if cfg.Warm <= 0 {
		cfg.Warm = cfg.Duration / 5
	}
	sp := cfg.Spec
	if sp.Lenders <= 0 || sp.UplinkRate <= 0 {
		return res, errors.New("lab: a nic rack needs lenders and an uplink rate")
	}
	for _, n := range cfg.Bonds {
		if n < 1 || n > sp.Lenders {
			return res, fmt.Errorf("lab: a bond of %d on %d lenders", n, sp.Lenders)
		}
	}
	if cfg.StateDir == "" {
		dir, err := os.MkdirTemp("", "rialto-nic-rack-")
		if err != nil {
			return res, fmt.Errorf("lab: %w", err)
		}
		defer os.RemoveAll(dir)
		cfg.StateDir = dir
	}
	bits := func(v float64) string { return strconv.FormatInt(int64(v), 10) + "bit" }
	rc := rack.Config{Binary: cfg.Binary, StateDir: cfg.StateDir, Agents: sp.Lenders, Borrowers: 1, Uplinks: true,
		UplinkRate: bits(sp.UplinkRate), NICRate: bits(sp.UplinkRate),
		CongestionControl: DefaultCongestionControl, LogLevel: "warn", Logger: cfg.Logger}
	if sp.BorrowerLinkRate > 0 {
		rc.LinkRate = bits(sp.BorrowerLinkRate)
		rc.Queue = rackQueue(math.Min(sp.BorrowerLinkRate, math.Max(sp.LenderLinkRate, 1)))
	}
	for range sp.Lenders {
		r := "10gbit"
		if sp.LenderLinkRate > 0 {
			r = bits(sp.LenderLinkRate)
		}
		rc.AgentRates = append(rc.AgentRates, r)
	}
	r, err := rack.Start(ctx, rc)
	if err != nil {
		return res, fmt.Errorf("lab: rack: %w", err)
	}
	defer func() {
		if cerr := r.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("lab: rack: %w", cerr)
		}
	}()
	c := r.Client()
	if err := waitNICs(ctx, c, sp.Lenders); err != nil {
		return res, err
	}
	xdg, err := os.MkdirTemp("", "rialto-nic-rack-xdg-")
	if err != nil {
		return res, fmt.Errorf("lab: %w", err)
	}
	defer os.RemoveAll(xdg)
	const port = 5301
	stop, err := iperfServer(ctx, r, port)
	if err != nil {
		return res, err
	}
	defer stop()

	res.Sizes, res.Bonds = cfg.Sizes, cfg.Bonds
	res.Runs = map[string][][]udpResult{"direct": make([][]udpResult, len(cfg.Sizes)), "lent": make([][]udpResult, len(cfg.Sizes)), "bond": make([][]udpResult, len(cfg.Bonds))}
	lenders := r.Agents()
	borrower := r.Borrower(0)
	run := func(node rack.Node, p, streams int, offer float64) (udpResult, error) {
		k := nicLinks{r: r, spec: sp, lenders: lenders}
		if node.Namespace == borrower.Namespace {
			k.borrower = &borrower
		} else {
			k.lenders = []rack.Node{node}
		}
		return udpRun(ctx, r, node, k, port, p, streams, offer, cfg.Duration, cfg.Warm)
	}
	if len(cfg.Sizes) > 0 {
		err := withNICLease(ctx, r, cfg.Binary, xdg, api.LeaseRequest{Kind: api.KindNIC, Affinity: []string{lenders[0].Name}}, func() error {
			for range cfg.Rounds {
				for i, p := range cfg.Sizes {
					offer := 1.05 * sp.UplinkRate / 8 / sim.FrameCoef(p)
					d, err := run(lenders[0], p, 1, offer)
					if err != nil {
						return fmt.Errorf("direct, %d B: %w", p, err)
					}
					l, err := run(r.Borrower(0), p, 1, offer)
					if err != nil {
						return fmt.Errorf("lent, %d B: %w", p, err)
					}
					res.Runs["direct"][i] = append(res.Runs["direct"][i], d)
					res.Runs["lent"][i] = append(res.Runs["lent"][i], l)
				}
			}
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("lab: %w", err)
		}
	}
	for range cfg.Rounds {
		for i, n := range cfg.Bonds {
			req := api.LeaseRequest{Kind: api.KindNIC, Affinity: []string{lenders[0].Name}}
			if n > 1 {
				req = api.LeaseRequest{Kind: api.KindNIC, Count: n, Bandwidth: float64(n) * sp.UplinkRate / 8}
			}
			flows := max(sp.FlowsPerLender, 1)
			p := sp.BondPayload
			offer := 1.05 * sp.UplinkRate / 8 / sim.FrameCoef(p) / float64(flows)
			err := withNICLease(ctx, r, cfg.Binary, xdg, req, func() error {
				g, err := run(r.Borrower(0), p, n*flows, offer)
				res.Runs["bond"][i] = append(res.Runs["bond"][i], g)
				return err
			})
			if err != nil {
				return res, fmt.Errorf("lab: bond of %d: %w", n, err)
			}
		}
	}
	for i := range cfg.Sizes {
		d, l := medianRun(res.Runs["direct"][i]), medianRun(res.Runs["lent"][i])
		res.Direct, res.DirectBusy = append(res.Direct, d.Payload), append(res.DirectBusy, d.Busy)
		res.Lent, res.LentBusy = append(res.Lent, l.Payload), append(res.LentBusy, l.Busy)
		res.LentSegs = append(res.LentSegs, l.SegsPerPacket)
	}
	for i := range cfg.Bonds {
		b := medianRun(res.Runs["bond"][i])
		res.Bond, res.BondBusy = append(res.Bond, b.Payload), append(res.BondBusy, b.Busy)
		res.BondSegs = append(res.BondSegs, b.SegsPerPacket)
	}
	return res, nil
}

// medianRun is the run of median payload rate (the lower middle one of an
// even count).
func medianRun(rs []udpResult) udpResult {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b udpResult) int { return cmp.Compare(a.Payload, b.Payload) })
	return s[(len(s)-1)/2]
}

// withNICLease makes the lease through the API, attaches it in the rack's
// first borrower namespace with `rialto attach`, runs f, and detaches and
// releases it.
func withNICLease(ctx context.Context, r *rack.Rack, bin, xdg string, req api.LeaseRequest, f func() error) (err error) {
	c := r.Client()
	l, err := c.CreateLease(ctx, req)
	if err != nil {
		return fmt.Errorf("nic lease: %w", err)
	}
	defer func() { _, _ = c.ReleaseLease(context.WithoutCancel(ctx), l.ID) }()
	att, err := attachNIC(ctx, r, bin, xdg, l.ID)
	if err != nil {
		return err
	}
	defer func() {
		if derr := att.detach(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = derr
		}
	}()
	return f()
}

// waitNICs waits until the rack lends n nics.
func waitNICs(ctx context.Context, c *api.Client, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		devs, err := c.Devices(ctx)
		if err != nil {
			return err
		}
		have := 0
		for _, d := range devs {
			if d.Kind == api.KindNIC && d.State == "available" {
				have++
			}
		}
		if have >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: the rack lends %d nics, want %d", have, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// nicAttachment is a `rialto attach` process holding a nic lease's
// interface in a borrower's namespace.
type nicAttachment struct {
	cmd    *exec.Cmd
	bin    string
	env    []string
	id     string
	done   chan struct{}
	mu     sync.Mutex
	stderr strings.Builder
}

func (a *nicAttachment) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stderr.Write(p)
}

func (a *nicAttachment) log() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stderr.String()
}

// attachNIC runs `rialto attach LEASE` in the rack's first borrower
// namespace and waits for it to print the interface.
func attachNIC(ctx context.Context, r *rack.Rack, bin, xdg, id string) (*nicAttachment, error) {
	a := &nicAttachment{bin: bin, id: id, done: make(chan struct{}),
		env: append(os.Environ(), append(r.Env(), "XDG_RUNTIME_DIR="+xdg)...)}
	a.cmd = r.Command(context.WithoutCancel(ctx), r.Borrower(0), bin, "attach", id, "--iface", "rnic0", "--default-route", "--log-level", "warn")
	a.cmd.Env = a.env
	a.cmd.Stderr = a
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("lab: rialto attach: %w", err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		_ = a.cmd.Wait()
		close(a.done)
	}()
	select {
	case <-lines:
		return a, nil
	case <-a.done:
		return nil, fmt.Errorf("lab: rialto attach %s ended: %s", id, a.log())
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	_ = a.cmd.Process.Kill()
	<-a.done
	return nil, fmt.Errorf("lab: rialto attach %s: no interface: %s", id, a.log())
}

// detach runs `rialto detach` and waits for the attach process to end
// (killing it after 10 s).
func (a *nicAttachment) detach(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, a.bin, "detach", a.id)
	cmd.Env = a.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = a.cmd.Process.Kill()
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
	if err != nil {
		return fmt.Errorf("lab: rialto detach: %v: %s", err, out)
	}
	return nil
}

// iperfServer runs an iperf3 server on the outside's server address until
// the returned function stops it.
func iperfServer(ctx context.Context, r *rack.Rack, port int) (func(), error) {
	srv := r.Outside().Command(context.WithoutCancel(ctx), "iperf3", "-s", "--forceflush", "-B", r.Outside().Server.String(), "-p", strconv.Itoa(port))
	out, err := srv.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("lab: iperf3 server: %w", err)
	}
	done := make(chan struct{})
	ready := make(chan struct{})
	go func() {
		defer close(done)
		br := bufio.NewReader(out)
		said := false
		for {
			line, err := br.ReadString('\n')
			if !said && strings.Contains(line, "Server listening") {
				said = true
				close(ready)
			}
			if err != nil {
				return
			}
		}
	}()
	stop := func() {
		_ = srv.Process.Kill()
		<-done
		_ = srv.Wait()
	}
	select {
	case <-ready:
		return stop, nil
	case <-done:
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	stop()
	return nil, errors.New("lab: iperf3 server not listening")
}

// udpResult is one iperf3 run: the payload bytes/s that left the
// lenders' uplinks in the middle of the run, and how busy the busiest link
// it could fill was (bytes it carried over what its rate allows): about 1
// when a link bounded the run, less when the machine's CPU did.
type udpResult struct {
	Payload, Busy float64
	// SegsPerPacket is, for a run through lent NICs, the TCP segments the
	// tunnels sent over the lenders' rack links per packet the lenders
	// forwarded (a full segment holds about 1448/(payload+36) packets).
	SegsPerPacket float64
}

// nicLinks are the shaped links a run can fill: the lenders' uplinks
// (counted in the lenders' namespaces) and, for a run through lent NICs,
// the lenders' and the borrower's rack links (counted at the bridge).
type nicLinks struct {
	r        *rack.Rack
	spec     sim.NICRackSpec
	lenders  []rack.Node
	borrower *rack.Node // nil: a direct run
}

// linkCount is what the counters of a run's links said, each read
// timestamped (the middle of its read).
type linkCount struct {
	payload []float64 // UDP payload through each uplink (read at at[i])
	packets []float64 // packets through each uplink
	segs    []float64 // segments (tbf packets) through each lender's rack link
	bytes   []float64
	at      []time.Time
}

// read counts the UDP payload the lenders' uplinks sent (their interface
// counters: UDP is sent packet by packet) and the bytes each shaped link
// carried the way the run fills it. The rack links carry the tunnels'
// TCP, which the kernel hands over in segmentation-offloaded bursts: their
// interface counters count one set of headers per burst, tc tbf one per
// segment (what its rate applies to), so they are read from the tbf
// qdiscs: at the bridge's end of each lender's link (towards the lender)
// and in the borrower's namespace (from it). Every counter is read over
// netlink, in process.
func (k nicLinks) read() (linkCount, error) {
	var c linkCount
	stamp := func(f func() error) (time.Time, error) {
		t := time.Now()
		err := f()
		return t.Add(time.Since(t) / 2), err
	}
	for _, l := range k.lenders {
		var b, n uint64
		at, err := stamp(func() error {
			return k.r.Do(l, func() error {
				link, err := netlink.LinkByName("wan0")
				if err != nil {
					return err
				}
				st := link.Attrs().Statistics
				if st == nil {
					return errors.New("no statistics")
				}
				b, n = st.TxBytes, st.TxPackets
				return nil
			})
		})
		if err != nil {
			return c, fmt.Errorf("%s's uplink: %w", l.Name, err)
		}
		c.payload = append(c.payload, float64(b)-float64(n)*(sim.UDPIPOverhead+sim.EthernetHeader))
		c.packets = append(c.packets, float64(n))
		c.bytes, c.at = append(c.bytes, float64(b)), append(c.at, at)
	}
	if k.borrower == nil {
		return c, nil
	}
	for _, l := range k.lenders {
		h, err := k.host(l)
		if err != nil {
			return c, err
		}
		var v, n float64
		at, err := stamp(func() error { v, n, err = tbfSent(h.RootIface); return err })
		if err != nil {
			return c, fmt.Errorf("%s's rack link: %w", l.Name, err)
		}
		c.bytes, c.at = append(c.bytes, v), append(c.at, at)
		c.segs = append(c.segs, n)
	}
	h, err := k.host(*k.borrower)
	if err != nil {
		return c, err
	}
	var v float64
	at, err := stamp(func() error {
		return k.r.Do(*k.borrower, func() error { v, _, err = tbfSent(h.Iface); return err })
	})
	if err != nil {
		return c, fmt.Errorf("the borrower's rack link: %w", err)
	}
	c.bytes, c.at = append(c.bytes, v), append(c.at, at)
	return c, nil
}

func sum(xs []float64) float64 {
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t
}

// rates are the links' rates in bytes/s, in read's order (0: unshaped).
func (k nicLinks) rates() []float64 {
	var out []float64
	for range k.lenders {
		out = append(out, k.spec.UplinkRate/8)
	}
	if k.borrower == nil {
		return out
	}
	for range k.lenders {
		out = append(out, k.spec.LenderLinkRate/8)
	}
	return append(out, k.spec.BorrowerLinkRate/8)
}

// host is the lab host of a rack node.
func (k nicLinks) host(n rack.Node) (netns.Host, error) {
	lab := k.r.Lab()
	for i := range lab.Len() {
		if h := lab.Host(i); h.Namespace == n.Namespace {
			return h, nil
		}
	}
	return netns.Host{}, fmt.Errorf("no lab host for %s", n.Name)
}

// tbfSent returns the bytes and packets (segments, for offloaded TCP) the
// root tbf qdisc of the interface sent (in the calling thread's network
// namespace).
func tbfSent(iface string) (bytes, packets float64, err error) {
	link, err := netlink.LinkByName(iface)
	if err != nil {
		return 0, 0, err
	}
	qs, err := netlink.QdiscList(link)
	if err != nil {
		return 0, 0, err
	}
	for _, q := range qs {
		a := q.Attrs()
		if q.Type() == "tbf" && a.Parent == netlink.HANDLE_ROOT && a.Statistics != nil && a.Statistics.Basic != nil {
			return float64(a.Statistics.Basic.Bytes), float64(a.Statistics.Basic.Packets), nil
		}
	}
	return 0, 0, fmt.Errorf("no tbf on %s", iface)
}

// udpRun runs iperf3 UDP (payload size p, streams streams each offering
// offer bytes/s of payload) from node to the outside server for d and
// measures, between warm after its start and warm before its end, the
// links k names.
func udpRun(ctx context.Context, r *rack.Rack, node rack.Node, k nicLinks, port, p, streams int, offer float64, d, warm time.Duration) (udpResult, error) {
	cmd := r.Command(ctx, node, "iperf3", "-c", r.Outside().Server.String(), "-p", strconv.Itoa(port), "-u",
		"-l", strconv.Itoa(p), "-b", strconv.FormatInt(int64(offer*8), 10), "-P", strconv.Itoa(max(streams, 1)),
		"-t", strconv.Itoa(int(d.Seconds())), "--connect-timeout", "3000", "--forceflush")
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Start(); err != nil {
		return udpResult{}, err
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	// The test starts when payload starts to leave the uplinks (polled
	// every 20 ms; iperf3's own output comes in bursts).
	ended := false
	var t0 time.Time
	first, err := k.read()
	tick := time.NewTicker(20 * time.Millisecond)
	for deadline := time.Now().Add(10 * time.Second); err == nil && t0.IsZero(); {
		select {
		case werr := <-waited:
			ended = true
			err = fmt.Errorf("iperf3 ended before sending: %v: %s", werr, stderr.String())
		case <-ctx.Done():
			err = ctx.Err()
		case now := <-tick.C:
			var c linkCount
			if c, err = k.read(); err == nil && sum(c.payload) > sum(first.payload)+float64(p) {
				t0 = now
			} else if err == nil && now.After(deadline) {
				err = fmt.Errorf("iperf3 sent nothing in 10 s: %s", stderr.String())
			}
		}
	}
	tick.Stop()
	sample := func(at time.Duration) (c linkCount, err error) {
		select {
		case err := <-waited:
			ended = true
			return c, fmt.Errorf("iperf3 ended early (%v after its start, sampling at %v): %v: %s", time.Since(t0), at, err, stderr.String())
		case <-ctx.Done():
			return c, ctx.Err()
		case <-time.After(time.Until(t0.Add(at))):
		}
		return k.read()
	}
	if err == nil {
		var c0, c1 linkCount
		if c0, err = sample(warm); err == nil {
			if c1, err = sample(d - warm); err == nil {
				if werr := <-waited; werr != nil {
					return udpResult{}, fmt.Errorf("iperf3: %v: %s", werr, stderr.String())
				}
				// Each counter over its own read times.
				res := udpResult{}
				for i := range c0.payload {
					res.Payload += (c1.payload[i] - c0.payload[i]) / c1.at[i].Sub(c0.at[i]).Seconds()
				}
				if len(c0.segs) > 0 {
					if pk := sum(c1.packets) - sum(c0.packets); pk > 0 {
						res.SegsPerPacket = (sum(c1.segs) - sum(c0.segs)) / pk
					}
				}
				for i, rate := range k.rates() {
					if rate > 0 {
						res.Busy = math.Max(res.Busy, (c1.bytes[i]-c0.bytes[i])/c1.at[i].Sub(c0.at[i]).Seconds()/rate)
					}
				}
				return res, nil
			}
		}
	}
	if !ended {
		_ = cmd.Process.Kill()
		<-waited
	}
	return udpResult{}, err
}

// Fed is the simulator's efficiency for each size with the tunnel's
// segments as measured (sim.Real.Sim of nic-efficiency).
func (r NICRackResult) Fed(spec sim.NICRackSpec) ([]float64, error) {
	out := make([]float64, len(r.Sizes))
	for i, p := range r.Sizes {
		fed := spec
		fed.Tunnel.SegmentsPerPacket = r.LentSegs[i]
		e, _, _, _, err := sim.NICEfficiency(fed, p)
		if err != nil {
			return nil, err
		}
		out[i] = e
	}
	return out, nil
}

// FedBond is the simulator's bond goodput (payload bytes/s) for each bond
// size with the tunnels' segments as measured.
func (r NICRackResult) FedBond(spec sim.NICRackSpec) ([]float64, error) {
	out := make([]float64, len(r.Bonds))
	for i, n := range r.Bonds {
		fed := spec
		fed.Tunnel.SegmentsPerPacket = r.BondSegs[i]
		g, _, _, err := sim.NICBond(fed, n)
		if err != nil {
			return nil, err
		}
		out[i] = g
	}
	return out, nil
}

// MinBusy is how busy a shaped link must have been for a run to compare
// anything: below it the machine's CPU, not a link, bounded the run.
const MinBusy = 0.97

func init() {
	counterparts["nic-efficiency"] = func(ctx context.Context, res *sim.Result) error {
		bin, ok, err := nicCounterpartBinary(res)
		if !ok || err != nil {
			return err
		}
		spec := sim.DefaultNICRack
		m, err := RunNICRack(ctx, NICRackConfig{Binary: bin, Spec: spec, Sizes: spec.Sizes, Rounds: 3})
		if err != nil {
			return err
		}
		fed, err := m.Fed(spec)
		if err != nil {
			return err
		}
		eff, share := m.Efficiency(), m.LinkShare(spec)
		for i, p := range m.Sizes {
			note := fmt.Sprintf("direct filled %.0f%% of its link; the tunnel sent %.2f TCP segments per packet (full segments: %.2f)", 100*share[i], m.LentSegs[i], spec.Tunnel.FullSegments(p))
			var void string
			if m.DirectBusy[i] < MinBusy || m.LentBusy[i] < MinBusy {
				void = fmt.Sprintf("links busy %.0f%% direct, %.0f%% lent (below %.0f%%): the machine's CPU, not the link, bounded a run", 100*m.DirectBusy[i], 100*m.LentBusy[i], 100*MinBusy)
			}
			if !setReal(res, sim.NICEffMetric(p), sim.Real{Value: eff[i], Sim: fed[i], Tolerance: 0.03, Note: note, Void: void}) {
				return errors.New("lab: nic-efficiency: the experiment's metrics changed")
			}
		}
		return nil
	}
	counterparts["nic-bond"] = func(ctx context.Context, res *sim.Result) error {
		bin, ok, err := nicCounterpartBinary(res)
		if !ok || err != nil {
			return err
		}
		spec := sim.DefaultNICRack
		var bonds []int
		for n := 1; n <= spec.Lenders; n++ {
			bonds = append(bonds, n)
		}
		m, err := RunNICRack(ctx, NICRackConfig{Binary: bin, Spec: spec, Bonds: bonds, Rounds: 3})
		if err != nil {
			return err
		}
		fed, err := m.FedBond(spec)
		if err != nil {
			return err
		}
		for i, n := range m.Bonds {
			note := fmt.Sprintf("the tunnels sent %.2f TCP segments per packet (full segments: %.2f); busiest link %.0f%% busy", m.BondSegs[i], spec.Tunnel.FullSegments(spec.BondPayload), 100*m.BondBusy[i])
			r := sim.Real{Value: m.Bond[i] / m.Bond[0], Sim: fed[i] / fed[0], Tolerance: 0.05, Note: note}
			if n == 1 {
				r = sim.Real{Value: m.Bond[0] * 8 / 1e6, Sim: fed[0] * 8 / 1e6, Tolerance: 0.03, Note: note}
			}
			if m.BondBusy[i] < MinBusy || m.BondBusy[0] < MinBusy {
				r.Void = fmt.Sprintf("busiest link %.0f%% busy (one lender: %.0f%%; below %.0f%%): the machine's CPU, not a link, bounded a run", 100*m.BondBusy[i], 100*m.BondBusy[0], 100*MinBusy)
			}
			if !setReal(res, sim.NICBondMetric(n), r) {
				return errors.New("lab: nic-bond: the experiment's metrics changed")
			}
		}
		return nil
	}
}

// nicCounterpartBinary is the rialto binary the NIC counterparts run (this
// one: `rialto sim run --real`); ok is false, with a note in res, when the
// rack cannot run here.
func nicCounterpartBinary(res *sim.Result) (string, bool, error) {
	if err := rack.Available(); err != nil {
		res.Notes = append(res.Notes, "real counterpart not run: "+err.Error())
		return "", false, nil
	}
	for _, tool := range []string{"nft", "iperf3"} {
		if _, err := exec.LookPath(tool); err != nil {
			res.Notes = append(res.Notes, "real counterpart not run: "+tool+" not installed")
			return "", false, nil
		}
	}
	bin, err := os.Executable()
	return bin, err == nil, err
}
