// Command nic-bench measures lent NICs and the accelerator slots' UDP
// message path side by side with their peers, in one run (bench/nic/run.sh
// writes docs/bench/nic.md):
//
//   - "nic": one lent NIC against the same link used directly, and bonds of
//     2 and 3 lenders against one lent NIC, with iperf3 over tbf-shaped
//     uplinks, through the product path: an emulated rack (internal/rack,
//     Uplinks) whose `rialto agent` processes lend their uplinks, leases
//     made by the control plane's API, and `rialto attach` in a borrower's
//     network namespace.
//   - "udp": 64-byte messages per second and round trips through a slot's
//     UDP path (an accelerator lease made by the API of an emulated rack,
//     internal/rack, served by a rialto agent) against "udp-echo", a UDP
//     echo with one system call per message run beside the agent, with
//     the link's line rate as the ceiling.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/bench/internal/iperf"
	"github.com/rialto-project/rialto/bench/internal/stats"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/rack"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: nic-bench run|udp-echo [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "udp-echo":
		err = udpEcho(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nic-bench:", err)
		os.Exit(1)
	}
}

// udpEcho is the baseline: one recvfrom and one sendto per message.
func udpEcho(args []string) error {
	fs := flag.NewFlagSet("udp-echo", flag.ExitOnError)
	listen := fs.String("listen", "", "address")
	_ = fs.Parse(args)
	c, err := net.ListenUDP("udp4", mustUDPAddr(*listen))
	if err != nil {
		return err
	}
	fmt.Println("ready")
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			return err
		}
		_, _ = c.WriteToUDP(buf[:n], from)
	}
}

func mustUDPAddr(s string) *net.UDPAddr {
	a, err := net.ResolveUDPAddr("udp4", s)
	if err != nil {
		panic(err)
	}
	return a
}

type config struct {
	runs    int
	dur     time.Duration
	rate    string // the NIC part's uplinks
	udpRate string // the UDP part's rack links
	parts   string
	out     string
	bin     string
	rialto  string
	sockets int
	window  int
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var c config
	fs.IntVar(&c.runs, "runs", 3, "interleaved runs (medians)")
	fs.DurationVar(&c.dur, "dur", 4*time.Second, "length of each measurement")
	fs.StringVar(&c.rate, "rate", "100mbit", "tbf rate of the lent uplinks (nic part)")
	fs.StringVar(&c.udpRate, "udp-rate", "10gbit", "tbf rate of the rack's links (udp part)")
	fs.StringVar(&c.parts, "parts", "nic,udp", "nic, udp or both")
	fs.StringVar(&c.out, "out", "docs/bench/nic.md", "markdown output")
	fs.StringVar(&c.rialto, "rialto", "bin/rialto", "rialto binary (udp part)")
	fs.IntVar(&c.sockets, "sockets", 4, "client sockets (udp part)")
	fs.IntVar(&c.window, "window", 64, "requests in flight per socket (udp part)")
	_ = fs.Parse(args)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	c.bin = exe
	var md strings.Builder
	fmt.Fprintf(&md, "## Lent NICs and UDP messages\n\nMeasured %s by `bench/nic/run.sh` (bench/nic) at commit %s on %s; %d interleaved runs per figure (medians), %v each; links shaped with tc tbf as each section says.\n\n",
		stats.Stamp(), stats.Commit("."), stats.Machine(), c.runs, c.dur)
	if strings.Contains(c.parts, "nic") {
		if err := benchNIC(c, &md); err != nil {
			return fmt.Errorf("nic part: %w", err)
		}
	}
	if strings.Contains(c.parts, "udp") {
		if err := benchUDP(c, &md); err != nil {
			return fmt.Errorf("udp part: %w", err)
		}
	}
	fmt.Fprintf(&md, "Steal time during the run: %s; load average at the end: %s.\n", stealNote(), loadAvg())
	if err := os.MkdirAll(filepath.Dir(c.out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(c.out, []byte(md.String()), 0o644)
}

var stealStart = stats.SampleCPU()

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ") + fmt.Sprintf(" (%d vCPUs, shared with other work)", runtime.NumCPU())
}

func stealNote() string {
	pct, ok := stealStart.StealUntil(stats.SampleCPU())
	if !ok {
		return "not measured"
	}
	return fmt.Sprintf("%.1f%% of CPU time since the bench started", pct)
}

// ---- processes and iperf3 ----

type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
}

func (ch *child) stop() {
	_ = ch.in.Close()
	done := make(chan struct{})
	go func() { _ = ch.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = ch.cmd.Process.Kill()
		<-done
	}
}

func startChild(cmd *exec.Cmd) (*child, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := &child{cmd: cmd, in: in}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		ch.stop()
		return nil, fmt.Errorf("%v: %q %v: %s", cmd.Args, line, err, stderr.String())
	}
	return ch, nil
}

// nicRow is one configuration of the NIC part: the direct path, or a
// lease of lenders parts (a bond when more than one) attached in mode.
type nicRow struct {
	name    string
	lenders int
	mode    string
	streams int
}

func benchNIC(c config, md *strings.Builder) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "nic-bench-rack")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// Three lenders whose uplinks (wan0) are shaped to c.rate and lent at
	// that rate; one borrower namespace; the rack's own links unshaped.
	r, err := rack.Start(ctx, rack.Config{Binary: c.rialto, StateDir: dir, Agents: 3, Borrowers: 1,
		Uplinks: true, UplinkRate: c.rate, NICRate: c.rate, LogLevel: "warn", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer r.Close()
	out, borrower := r.Outside(), r.Borrower(0)
	linkBps, err := netns.ParseRate(c.rate)
	if err != nil {
		return err
	}
	xdg, err := os.MkdirTemp("", "nic-bench-attach")
	if err != nil {
		return err
	}
	defer os.RemoveAll(xdg)
	rows := []nicRow{{"direct (iperf3 on lender 1 over its uplink)", 0, "", 4},
		{"1 lent NIC", 1, "flow", 4}, {"bond of 2, per-flow", 2, "flow", 8}, {"bond of 3, per-flow", 3, "flow", 12},
		{"bond of 3, per-packet (2 connections per lender)", 3, "packet", 12}}
	res := make([][]float64, len(rows))
	const port = 5400
	outside := func(ctx context.Context, args ...string) *exec.Cmd { return out.Command(ctx, "iperf3", args...) }
	srv, err := iperf.StartServer(ctx, outside, out.Server.String(), port, 10*time.Second)
	if err != nil {
		return err
	}
	defer srv.Stop()
	inBorrower := func(ctx context.Context, args ...string) *exec.Cmd {
		return r.Command(ctx, borrower, "iperf3", args...)
	}
	onLender := func(ctx context.Context, args ...string) *exec.Cmd {
		return r.Command(ctx, r.Agent(0), "iperf3", args...)
	}
	for run := 0; run < c.runs; run++ {
		for i, row := range rows {
			var bps float64
			if row.lenders == 0 {
				bps, err = iperf.Client(ctx, onLender, out.Server.String(), port, int(c.dur.Seconds()), "-P", strconv.Itoa(row.streams))
			} else {
				bps, err = leaseIperf(ctx, c, r, xdg, row, linkBps, func() (float64, error) {
					return iperf.Client(ctx, inBorrower, out.Server.String(), port, int(c.dur.Seconds()), "-P", strconv.Itoa(row.streams))
				})
			}
			if err != nil {
				return err
			}
			res[i] = append(res[i], bps)
			fmt.Fprintf(os.Stderr, "nic run %d %s: %.1f Mbit/s\n", run, row.name, bps/1e6)
		}
	}
	direct, one := median(res[0]), median(res[1])
	fmt.Fprintf(md, "### Lent NICs\n\nAn emulated rack (internal/rack): three `rialto agent` processes, each lending its uplink wan0 (`--nic wan=wan0:%s`), shaped with tc tbf to %s at both ends; the rack's own links (the tunnels') are not shaped. Each lent-NIC row is a lease made through the control plane's API (`kind: nic`; one lender: a whole interface; a bond of N: `count` N, `bandwidth` N × %s, so N different lenders) and attached by `rialto attach` in a borrower's own network namespace, its tunnel under TLS with the agents' node certificates (`rialto-nics://`, the default); iperf3 TCP goes to the outside server, which only the lenders reach. The direct row runs iperf3 on lender 1 itself, over its uplink. Rows are interleaved in each run; every lent-NIC row makes, attaches, detaches and releases its lease.\n\n", c.rate, c.rate, c.rate)
	md.WriteString("| path | streams | Mbit/s (median) | runs | vs direct | vs 1 lent NIC | goal |\n|---|---|---|---|---|---|---|\n")
	goals := []string{"", "≥ 90% of direct", "≥ 1.8×", "≥ 2.6×", ""}
	for i, row := range rows {
		m := median(res[i])
		fmt.Fprintf(md, "| %s | %d | %.1f | %s | %.0f%% | %.2f× | %s |\n", row.name, row.streams, m/1e6, mbits(res[i]), 100*m/direct, m/one, goals[i])
	}
	md.WriteString("\nThe per-packet bond stripes each lender's share over two connections and restores the order at the receiving end; flows are still hashed to lenders, since each lender translates to its own address (docs/nic.md).\n\n")
	fmt.Fprintf(md, "Commands: `rialto up --netns --agents 3 --uplinks --uplink-rate %s` is the same rack by hand; `rialto lease create --kind nic [--count N --bandwidth N×%s]` (here through the API), `ip netns exec BORROWER rialto attach LEASE --iface rnic0 --bond-mode flow|packet`, `ip netns exec OUTSIDE iperf3 -s -B %s`, `ip netns exec BORROWER|NODE1 iperf3 -c %s -t %d -P STREAMS -J`, `rialto detach LEASE`, `rialto lease release LEASE`.\n\n",
		c.rate, c.rate, out.Server, out.Server, int(c.dur.Seconds()))
	return nil
}

// leaseIperf makes row's lease through the API, attaches it with `rialto
// attach` in the borrower's namespace, measures with measure, and detaches
// and releases it.
func leaseIperf(ctx context.Context, c config, r *rack.Rack, xdg string, row nicRow, linkBps int64, measure func() (float64, error)) (float64, error) {
	req := api.LeaseRequest{Kind: api.KindNIC, Affinity: []string{r.Agent(0).Name}}
	if row.lenders > 1 {
		req = api.LeaseRequest{Kind: api.KindNIC, Count: row.lenders, Bandwidth: float64(row.lenders) * float64(linkBps) / 8}
	}
	l, err := r.Client().CreateLease(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("lease for %s: %w", row.name, err)
	}
	defer func() { _, _ = r.Client().ReleaseLease(context.Background(), l.ID) }()
	env := append(os.Environ(), append(r.Env(), "XDG_RUNTIME_DIR="+xdg)...)
	att := r.Command(ctx, r.Borrower(0), c.rialto, "attach", l.ID, "--iface", "rnic0", "--bond-mode", row.mode, "--log-level", "warn")
	att.Env = env
	var stderr strings.Builder
	att.Stderr = &stderr
	stdout, err := att.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := att.Start(); err != nil {
		return 0, err
	}
	done := make(chan struct{})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		_ = att.Wait()
		close(done)
	}()
	stop := func() {
		det := exec.Command(c.rialto, "detach", l.ID)
		det.Env = env
		if out, err := det.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "nic-bench: detach %s: %v: %s\n", l.ID, err, out)
			_ = att.Process.Kill()
		}
		<-done
	}
	select {
	case <-lines:
	case <-done:
		return 0, fmt.Errorf("rialto attach %s: %s", l.ID, stderr.String())
	case <-time.After(30 * time.Second):
		_ = att.Process.Kill()
		<-done
		return 0, fmt.Errorf("rialto attach %s: no interface after 30 s: %s", l.ID, stderr.String())
	}
	bps, err := measure()
	stop()
	if err != nil {
		return 0, fmt.Errorf("%w\nrialto attach: %s", err, stderr.String())
	}
	return bps, nil
}

func mbits(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.0f", x/1e6))
	}
	return strings.Join(s, ", ")
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	return s[len(s)/2]
}

// ---- the UDP part ----

type udpResult struct {
	rate       float64 // answered messages per second
	p50, p99   time.Duration
	sent, lost int
	reordered  int
	answered   int
}

func benchUDP(c config, md *strings.Builder) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "nic-bench-rack")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	r, err := rack.Start(ctx, rack.Config{Binary: c.rialto, StateDir: dir, Agents: 1, AccelSlots: 2, LinkRate: c.udpRate,
		// Slots serve their UDP message path only without TLS.
		InsecureDataplane: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer r.Close()
	l, err := r.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "echo"})
	if err != nil {
		return err
	}
	u, err := accel.ParseURI(l.URI)
	if err != nil || len(u.Slots) == 0 {
		return fmt.Errorf("accel lease URI: %v", err)
	}
	slotAddr := u.Slots[0]
	node := r.Agent(0)
	echoAddr := net.JoinHostPort(node.Addr.String(), "7499")
	echo, err := startChild(r.Command(ctx, node, c.bin, "udp-echo", "-listen", echoAddr))
	if err != nil {
		return err
	}
	defer echo.stop()
	cli, err := appliance.DialUDP(ctx, slotAddr, []byte(u.Credential), "echo")
	if err != nil {
		return err
	}
	session := cli.Session()
	_ = cli.Close()
	// An MCT lease (the ERBIUM paper's rule engine, Maschi and Alonso):
	// 64-byte queries, one per datagram.
	rnd := rand.New(rand.NewPCG(2, 2))
	rules := mct.Generate(rnd, 2000)
	ruleJSON, _ := json.Marshal(rules)
	ml, err := r.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "mct", RoleConfig: &api.RoleConfig{Config: ruleJSON}})
	if err != nil {
		return err
	}
	mu, err := accel.ParseURI(ml.URI)
	if err != nil || len(mu.Slots) == 0 {
		return fmt.Errorf("mct lease URI: %v", err)
	}
	eng, err := mct.Compile(rules)
	if err != nil {
		return err
	}
	query, err := eng.EncodeAll(mct.GenerateQueries(rnd, 1))
	if err != nil {
		return err
	}
	mcli, err := appliance.DialUDP(ctx, mu.Slots[0], []byte(mu.Credential), "match")
	if err != nil {
		return err
	}
	mctSession := mcli.Session()
	_ = mcli.Close()
	const msg = 64
	var rialto, base, mctRes []udpResult
	for run := 0; run < c.runs; run++ {
		rr, err := udpLoad(slotAddr, session, c.sockets, c.window, c.dur, make([]byte, msg))
		if err != nil {
			return err
		}
		rialto = append(rialto, rr)
		br, err := udpLoad(echoAddr, 0, c.sockets, c.window, c.dur, make([]byte, msg))
		if err != nil {
			return err
		}
		base = append(base, br)
		mr, err := udpLoad(mu.Slots[0], mctSession, c.sockets, c.window, c.dur, query)
		if err != nil {
			return err
		}
		mctRes = append(mctRes, mr)
		fmt.Fprintf(os.Stderr, "udp run %d: slot %.0f msg/s, baseline %.0f msg/s, mct %.0f msg/s\n", run, rr.rate, br.rate, mr.rate)
	}
	bps, _ := netns.ParseRate(c.udpRate)
	wire := 14 + 20 + 8 + appliance.UDPHeaderSize + msg
	ceiling := float64(bps) / 8 / float64(wire)
	fmt.Fprintf(md, "### UDP messages to an accelerator slot\n\nAn accelerator lease (role echo) made through the API of an emulated rack (one `rialto agent`, link shaped to %s), its slot's UDP path (one message per datagram; recvmmsg/sendmmsg, UDP GRO and GSO, one SO_REUSEPORT socket per worker) against `nic-bench udp-echo`, a UDP echo with one recvfrom and one sendto per message, running in the agent's namespace. The client (root namespace, %d sockets, %d requests in flight each, sendmmsg/recvmmsg with UDP segmentation and receive offload, the same client for every server) sends %d-byte messages (a %d-byte datagram with the %d-byte header, the same datagrams to both servers). The network-attached FPGA paper (Weerasinghe et al.) serves 14.88 M msg/s at 10 GbE; here the ceiling is the shaped link's line rate for this datagram: %s ÷ (%d bytes × 8) = %.0f msg/s each way (tbf counts the Ethernet header, no preamble or gap).\n\n",
		c.udpRate, c.sockets, c.window, msg, appliance.UDPHeaderSize+msg, appliance.UDPHeaderSize, c.udpRate, wire, ceiling)
	md.WriteString("| server | msg/s (median) | of line rate | p50 RTT | p99 RTT | lost | reordered | runs (msg/s) |\n|---|---|---|---|---|---|---|---|\n")
	for _, x := range []struct {
		name string
		v    []udpResult
	}{{"slot UDP path, role echo (rialto agent)", rialto}, {"baseline echo, one syscall per message", base},
		{"slot UDP path, role mct (64-byte queries, 2000 rules)", mctRes}} {
		m := medianResult(x.v)
		var runs []string
		lost, reo, sent := 0, 0, 0
		for _, v := range x.v {
			runs = append(runs, fmt.Sprintf("%.0f", v.rate))
			lost += v.lost
			reo += v.reordered
			sent += v.sent
		}
		fmt.Fprintf(md, "| %s | %.0f | %.0f%% | %v | %v | %d of %d | %d | %s |\n", x.name, m.rate, 100*m.rate/ceiling, m.p50, m.p99, lost, sent, reo, strings.Join(runs, ", "))
	}
	rm, bm := medianResult(rialto), medianResult(base)
	fmt.Fprintf(md, "\nSlot UDP path / baseline: %.2f× the message rate (goal ≥ 5×).\n\n", rm.rate/bm.rate)
	md.WriteString("Commands: `rialto lease create --kind accel --role echo` (through the API), `ip netns exec NODE1 nic-bench udp-echo -listen NODE1:7499`; the load generator is nic-bench's own (bench/nic/main.go, udpLoad).\n\n")
	return nil
}

func medianResult(v []udpResult) udpResult {
	s := slices.Clone(v)
	sort.Slice(s, func(i, j int) bool { return s[i].rate < s[j].rate })
	return s[len(s)/2]
}

// udpLoad keeps window requests in flight on each of sockets connected
// UDP sockets for dur, with batched system calls, and reports answered
// messages per second, round-trip percentiles, losses (no answer within
// 200 ms) and reorderings (an answer older than one already received).
func udpLoad(addr string, session uint64, sockets, window int, dur time.Duration, body []byte) (udpResult, error) {
	var mu sync.Mutex
	var res udpResult
	var rtts []time.Duration
	var wg sync.WaitGroup
	errc := make(chan error, sockets)
	start := time.Now()
	end := start.Add(dur)
	for k := range sockets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, samples, err := udpWorker(addr, session, uint32(k), window, end, body)
			if err != nil {
				errc <- err
				return
			}
			mu.Lock()
			res.sent += r.sent
			res.answered += r.answered
			res.lost += r.lost
			res.reordered += r.reordered
			rtts = append(rtts, samples...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return res, err
	default:
	}
	res.rate = float64(res.answered) / dur.Seconds()
	if len(rtts) > 0 {
		slices.Sort(rtts)
		res.p50 = rtts[len(rtts)/2].Round(time.Microsecond)
		res.p99 = rtts[len(rtts)*99/100].Round(time.Microsecond)
	}
	return res, nil
}

func udpWorker(addr string, session uint64, id uint32, window int, end time.Time, body []byte) (udpResult, []time.Duration, error) {
	var r udpResult
	c, err := net.DialUDP("udp4", nil, mustUDPAddr(addr))
	if err != nil {
		return r, nil, err
	}
	defer c.Close()
	_ = c.SetReadBuffer(4 << 20)
	pc := ipv4.NewPacketConn(c)
	gro := appliance.EnableGRO(c)
	gso := true
	const batch = 64
	dlen := appliance.UDPHeaderSize + len(body)
	sendBuf := make([]byte, 0, batch*dlen)
	segOOB := appliance.SegmentOOB(nil, dlen)
	tx := make([]ipv4.Message, batch)
	rx := make([]ipv4.Message, batch)
	for i := range rx {
		rx[i].Buffers = [][]byte{make([]byte, 65536)}
		rx[i].OOB = make([]byte, 64)
	}
	sentAt := map[uint32]time.Time{}
	var samples []time.Duration
	seq := id << 24
	var highest uint32
	anyAnswer := false
	measuring := true
	for {
		now := time.Now()
		if measuring && now.After(end) {
			measuring = false
		}
		if !measuring && (len(sentAt) == 0 || now.After(end.Add(200*time.Millisecond))) {
			r.lost += len(sentAt)
			return r, samples, nil
		}
		n := 0
		sendBuf = sendBuf[:0]
		for measuring && len(sentAt)+n < window && n < batch {
			seq++
			sendBuf = appliance.AppendUDP(sendBuf, appliance.UDPHeader{Op: appliance.UDPReq, Seq: seq, Session: session}, body)
			sentAt[seq] = now
			n++
		}
		if n > 0 {
			// One segmented send (GSO) if the kernel takes it, else one
			// message per datagram in one sendmmsg.
			var msgs []ipv4.Message
			if gso && n > 1 {
				msgs = []ipv4.Message{{Buffers: [][]byte{sendBuf}, OOB: segOOB}}
			} else {
				for i := range n {
					tx[i] = ipv4.Message{Buffers: [][]byte{sendBuf[i*dlen : (i+1)*dlen]}}
				}
				msgs = tx[:n]
			}
			for off := 0; off < len(msgs); {
				k, err := pc.WriteBatch(msgs[off:], 0)
				if err != nil {
					if gso && n > 1 {
						gso = false
						for i := range n {
							tx[i] = ipv4.Message{Buffers: [][]byte{sendBuf[i*dlen : (i+1)*dlen]}}
						}
						msgs, off = tx[:n], 0
						continue
					}
					return r, nil, err
				}
				off += k
			}
		}
		r.sent += n
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		k, err := pc.ReadBatch(rx, 0)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return r, nil, err
			}
		}
		now = time.Now()
		for i := range k {
			size := 0
			if gro {
				size = appliance.GROSize(rx[i].OOB[:rx[i].NN])
			}
			appliance.SplitGRO(rx[i].Buffers[0][:rx[i].N], size, func(d []byte) {
				h, _, err := appliance.DecodeUDP(d)
				if err != nil {
					return
				}
				t0, ok := sentAt[h.Seq]
				if !ok {
					return // answered after being counted lost
				}
				delete(sentAt, h.Seq)
				if now.Before(end) {
					r.answered++ // the rate counts the measured interval only
				}
				samples = append(samples, now.Sub(t0))
				if anyAnswer && h.Seq < highest {
					r.reordered++
				}
				if h.Seq > highest || !anyAnswer {
					highest, anyAnswer = h.Seq, true
				}
			})
		}
		for s, t0 := range sentAt { // no answer in 200 ms: lost
			if now.Sub(t0) > 200*time.Millisecond {
				delete(sentAt, s)
				r.lost++
			}
		}
	}
}
