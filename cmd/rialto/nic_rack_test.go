package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/rack"
)

// nicRack is an emulated rack whose agents lend their uplinks (wan0, to an
// outside network only they reach) and whose borrowers have namespaces of
// their own; leases go through the CLI and the API, attachments are
// `rialto attach` processes in the borrowers' namespaces.
type nicRack struct {
	t   *testing.T
	bin string
	r   *rack.Rack
	xdg string // XDG_RUNTIME_DIR of the attach processes (their state)
}

func newNICRack(t *testing.T, cfg rack.Config) *nicRack {
	t.Helper()
	needNetns(t)
	for _, tool := range []string{"nft", "iperf3", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip(tool + " not installed")
		}
	}
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg.Binary, cfg.StateDir, cfg.Uplinks = bin, filepath.Join(t.TempDir(), "rack"), true
	r, err := rack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return &nicRack{t: t, bin: bin, r: r, xdg: t.TempDir()}
}

// cli runs the rialto CLI (in the root namespace) and returns its stdout.
func (n *nicRack) cli(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, n.bin, args...)
	cmd.Env = append(os.Environ(), n.r.Env()...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("rialto %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), nil
}

// create makes a lease with `rialto lease create -o json`.
func (n *nicRack) create(ctx context.Context, args ...string) api.Lease {
	n.t.Helper()
	out, err := n.cli(ctx, append([]string{"lease", "create", "-o", "json"}, args...)...)
	if err != nil {
		n.t.Fatal(err)
	}
	var l api.Lease
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		n.t.Fatalf("lease create: %v: %q", err, out)
	}
	return l
}

// attachment is a `rialto attach` process holding a nic lease's interface.
type attachment struct {
	cmd    *exec.Cmd
	done   chan struct{}
	iface  string
	addr   string
	stderr logtest.Buffer
}

func (a *attachment) log() string { return a.stderr.String() }

// attach runs `rialto attach LEASE --iface IFACE` in borrower's namespace
// and waits for the interface. Cleanup detaches it if the test did not.
func (n *nicRack) attach(ctx context.Context, borrower rack.Node, id, iface string, extra ...string) *attachment {
	n.t.Helper()
	args := append([]string{"attach", id, "--iface", iface, "--log-level", "warn"}, extra...)
	a := &attachment{cmd: n.r.Command(context.Background(), borrower, n.bin, args...), done: make(chan struct{})}
	a.cmd.Env = append(os.Environ(), append(n.r.Env(), "XDG_RUNTIME_DIR="+n.xdg)...)
	a.cmd.Stderr = &a.stderr
	stdout, err := a.cmd.StdoutPipe()
	if err != nil {
		n.t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		_ = a.cmd.Wait()
		close(a.done)
	}()
	n.t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			_ = a.cmd.Process.Kill()
			<-a.done
		}
	})
	select {
	case line := <-lines:
		f := strings.Fields(line)
		if len(f) != 2 || f[0] != iface {
			n.t.Fatalf("attach printed %q, want the interface and its address", line)
		}
		a.iface, a.addr = f[0], f[1]
	case <-a.done:
		n.t.Fatalf("attach %s ended: %s", id, a.log())
	case <-ctx.Done():
		n.t.Fatalf("attach %s: no interface: %s", id, a.log())
	}
	return a
}

// detach runs `rialto detach` and waits for the attach process to end.
func (n *nicRack) detach(ctx context.Context, a *attachment, id string) {
	n.t.Helper()
	cmd := exec.CommandContext(ctx, n.bin, "detach", id)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+n.xdg)
	if out, err := cmd.CombinedOutput(); err != nil {
		n.t.Fatalf("detach %s: %v: %s", id, err, out)
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		n.t.Fatalf("attach %s still running after detach", id)
	}
}

// ping reports whether borrower gets an answer from dst (one try, 1 s).
func (n *nicRack) ping(b rack.Node, dst string) bool {
	return n.r.Command(context.Background(), b, "busybox", "ping", "-c", "1", "-W", "1", dst).Run() == nil
}

// iperf runs a one-off iperf3 server on the outside's server address and
// a client in borrower's namespace; it returns the received bits/s and,
// for UDP, the percentage lost.
func (n *nicRack) iperf(ctx context.Context, b rack.Node, port int, args ...string) (bps, lost float64, err error) {
	srv := n.r.Outside().Server.String()
	s := n.r.Outside().Command(ctx, "iperf3", "-s", "-1", "--forceflush", "-B", srv, "-p", strconv.Itoa(port))
	sout, err := s.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	if err := s.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { _ = s.Process.Kill(); _ = s.Wait() }()
	br := bufio.NewReader(sout)
	for {
		line, rerr := br.ReadString('\n')
		if rerr != nil {
			return 0, 0, fmt.Errorf("iperf3 server: %v", rerr)
		}
		if strings.Contains(line, "Server listening") {
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, br) }()
	a := append([]string{"-c", srv, "-p", strconv.Itoa(port), "-J", "--connect-timeout", "3000"}, args...)
	out, cerr := n.r.Command(ctx, b, "iperf3", a...).Output()
	var j struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BPS float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			Sum struct {
				BPS  float64 `json:"bits_per_second"`
				Lost float64 `json:"lost_percent"`
			} `json:"sum"`
		} `json:"end"`
	}
	if jerr := json.Unmarshal(out, &j); jerr != nil {
		return 0, 0, fmt.Errorf("iperf3 %v: %v (%v)", a, cerr, jerr)
	}
	if j.Error != "" || cerr != nil {
		return 0, 0, fmt.Errorf("iperf3 %v: %s %v", a, j.Error, cerr)
	}
	if j.End.SumReceived.BPS > 0 {
		return j.End.SumReceived.BPS, 0, nil
	}
	return j.End.Sum.BPS, j.End.Sum.Lost, nil
}

// rxPackets reads an interface's received-packet counter in b's namespace.
func (n *nicRack) rxPackets(ctx context.Context, b rack.Node, iface string) int64 {
	n.t.Helper()
	out, err := n.r.Command(ctx, b, "cat", "/sys/class/net/"+iface+"/statistics/rx_packets").Output()
	if err != nil {
		n.t.Fatalf("rx_packets of %s: %v", iface, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		n.t.Fatal(err)
	}
	return v
}

// checkNICTLS checks that every lender of nic lease l serves its tunnel
// under TLS (rialto-nics://).
func checkNICTLS(t *testing.T, l api.Lease) {
	t.Helper()
	uris, err := borrower.NICURIs(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range uris {
		if !u.TLS {
			t.Errorf("lease %s: lender %s serves %s, want %s://", l.ID, u.Address, u.Redacted(), nic.SchemeTLS)
		}
	}
}

// TestNICLeaseOnRack is a lent NIC through the product path: `rialto lease
// create --kind nic --bandwidth` places a share of node1's uplink, `rialto
// attach` in a borrower's namespace creates its interface, and iperf3 (TCP
// and UDP) reaches a host that only the lenders reach; a second borrower
// of the same lender reaches neither the first one's address nor the
// lender's own, and receives none of the first one's traffic; the lease's
// rate cap holds.
func TestNICLeaseOnRack(t *testing.T) {
	n := newNICRack(t, rack.Config{Agents: 1, Borrowers: 2, UplinkRate: "200mbit"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b1, b2 := n.r.Borrower(0), n.r.Borrower(1)
	server := n.r.Outside().Server.String()
	if n.ping(b1, server) {
		t.Fatal("the outside answers the borrower before any attach: the test proves nothing")
	}

	// 24 Mbit/s of node1's uplink; the explanation names it.
	la := n.create(ctx, "--kind", "nic", "--bandwidth", "24Mbit/s")
	if la.Mode != api.ModeShared || la.Size != 3_000_000 || len(la.Parts) != 1 || la.Parts[0].Length != 3_000_000 {
		t.Fatalf("lease: %+v", la)
	}
	// The agents run with TLS on their data planes (the rack's default):
	// the tunnel too, verified by attach with the cluster CA.
	checkNICTLS(t, la)
	show, err := n.cli(ctx, "lease", "show", la.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"24Mbit/s", "request: nic 24Mbit/s", "wants 24Mbit/s", "lent interface"} {
		if !strings.Contains(show, want) {
			t.Errorf("lease show lacks %q:\n%s", want, show)
		}
	}
	a1 := n.attach(ctx, b1, la.ID, "rnic0")
	if want := nic.LeaseAddr(nic.DefaultPool, la.ID).String(); a1.addr != want {
		t.Errorf("borrower address %s, want the lease's own %s", a1.addr, want)
	}
	if !n.ping(b1, server) {
		t.Fatalf("no ping through the lent NIC: %s", a1.log())
	}
	// The second borrower shares node1's uplink.
	lb := n.create(ctx, "--kind", "nic", "--bandwidth", "50Mbit/s")
	a2 := n.attach(ctx, b2, lb.ID, "rnic0")
	if a2.addr == a1.addr {
		t.Fatalf("both borrowers have %s", a1.addr)
	}

	// TCP and UDP through the lent NIC; the rate cap holds (24 Mbit/s,
	// at most 10% more), while the second borrower sees none of it.
	rx0 := n.rxPackets(ctx, b2, "rnic0")
	tcp, _, err := n.iperf(ctx, b1, 5201, "-t", "3")
	if err != nil {
		t.Fatalf("%v\n%s", err, a1.log())
	}
	if tcp < 12e6 || tcp > 24e6*1.1 {
		t.Errorf("TCP through a 24 Mbit/s lease: %.1f Mbit/s", tcp/1e6)
	}
	udp, lost, err := n.iperf(ctx, b1, 5202, "-u", "-b", "16M", "-t", "2")
	if err != nil {
		t.Fatal(err)
	}
	if udp < 8e6 || lost > 10 {
		t.Errorf("UDP at 16 Mbit/s through a 24 Mbit/s lease: %.1f Mbit/s received, %.1f%% lost", udp/1e6, lost)
	}
	t.Logf("24 Mbit/s lease: TCP %.1f Mbit/s; UDP %.1f Mbit/s received, %.1f%% lost", tcp/1e6, udp/1e6, lost)
	if d := n.rxPackets(ctx, b2, "rnic0") - rx0; d > 5 {
		t.Errorf("the second borrower received %d packets while the first one used the NIC", d)
	}

	// Isolation: the second borrower reaches the outside, but not the
	// first borrower's address nor the lender's address on the lent
	// interface (both routed through its tunnel).
	if !n.ping(b2, server) {
		t.Fatal("the second borrower does not reach the outside")
	}
	if n.ping(b2, a1.addr) {
		t.Error("a borrower reaches another borrower's address")
	}
	lenderWAN := n.r.Outside().Uplinks[0].Addr.String()
	if n.ping(b2, lenderWAN) {
		t.Error("a borrower reaches the lender's address on the lent interface")
	}
	// The lender's own traffic is untouched.
	if err := n.r.Command(ctx, n.r.Agent(0), "busybox", "ping", "-c", "1", "-W", "2", server).Run(); err != nil {
		t.Errorf("the lender lost its own uplink: %v", err)
	}

	// Detach removes the interface; the lease stays until released.
	n.detach(ctx, a1, la.ID)
	if n.ping(b1, server) {
		t.Error("the outside still answers after detach")
	}
	if _, err := n.cli(ctx, "lease", "release", la.ID); err != nil {
		t.Fatal(err)
	}
	n.detach(ctx, a2, lb.ID)
}

// TestNICBondOnRack is a bond of three lenders through the product path
// (`rialto lease create --kind nic --count 3`): its parts are on three
// different lenders, several of them carry iperf3's flows, and when one
// lender's agent is SIGKILLed the bond degrades instead of breaking: TCP
// and UDP still pass through the survivors, at once and after the
// control plane's grace period (the default 10 s), when the node is down
// and the lease goes on without its part (marked lost, the borrower's
// bond drops that lender).
func TestNICBondOnRack(t *testing.T) {
	n := newNICRack(t, rack.Config{Agents: 3, Borrowers: 1, UplinkRate: "200mbit"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b := n.r.Borrower(0)
	l := n.create(ctx, "--kind", "nic", "--bandwidth", "90Mbit/s", "--count", "3")
	lenders := map[string]bool{}
	for _, p := range l.Parts {
		lenders[p.NodeID] = true
		if p.Length != 3_750_000 {
			t.Errorf("part %+v: want 30 Mbit/s", p)
		}
	}
	if l.Mode != api.ModeComposed || len(lenders) != 3 {
		t.Fatalf("bond: %+v", l)
	}
	checkNICTLS(t, l)
	a := n.attach(ctx, b, l.ID, "rnic0")
	bps, _, err := n.iperf(ctx, b, 5301, "-t", "3", "-P", "6")
	if err != nil {
		t.Fatalf("%v\n%s", err, a.log())
	}
	t.Logf("bond of 3 × 30 Mbit/s, 6 TCP flows: %.1f Mbit/s", bps/1e6)
	// More than one lender's 30 Mbit/s: the flows spread; at most the
	// bond's 90 (and 10%).
	if bps < 35e6 || bps > 90e6*1.1 {
		t.Errorf("6 TCP flows through a bond of 3 × 30 Mbit/s: %.1f Mbit/s", bps/1e6)
	}

	// SIGKILL node2's agent: the bond loses that lender, not the
	// interface.
	if err := n.r.KillAgent(1); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(a.log(), "lender lost") {
		select {
		case <-a.done:
			t.Fatalf("attach ended with the lender: %s", a.log())
		case <-ctx.Done():
			t.Fatalf("the bond did not notice the lender's loss: %s", a.log())
		case <-time.After(50 * time.Millisecond):
		}
	}
	bps, _, err = n.iperf(ctx, b, 5302, "-t", "3", "-P", "4")
	if err != nil {
		t.Fatalf("TCP through the surviving lenders: %v\n%s", err, a.log())
	}
	if bps < 5e6 {
		t.Errorf("TCP through the surviving lenders: %.1f Mbit/s", bps/1e6)
	}
	udp, lost, err := n.iperf(ctx, b, 5303, "-u", "-b", "10M", "-t", "2")
	if err != nil {
		t.Fatalf("UDP through the surviving lenders: %v", err)
	}
	t.Logf("after a lender's SIGKILL: TCP %.1f Mbit/s; UDP %.1f Mbit/s, %.1f%% lost", bps/1e6, udp/1e6, lost)
	if udp < 5e6 || lost > 20 {
		t.Errorf("UDP at 10 Mbit/s through the surviving lenders: %.1f Mbit/s, %.1f%% lost", udp/1e6, lost)
	}

	// Past the grace period node2 is down: the lease stays active and
	// loses only node2's part; the borrower drops that lender.
	var nodes []api.Node
	if out, err := n.cli(ctx, "nodes", "-o", "json"); err != nil || json.Unmarshal([]byte(out), &nodes) != nil {
		t.Fatalf("nodes: %v %q", err, out)
	}
	down := ""
	for _, nd := range nodes {
		if nd.Name == n.r.Agent(1).Name {
			down = nd.ID
		}
	}
	var cur api.Lease
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := n.cli(ctx, "lease", "show", l.ID, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(out), &cur); err != nil {
			t.Fatalf("lease show: %v: %q", err, out)
		}
		if slices.ContainsFunc(cur.Parts, func(p api.Part) bool { return p.Lost() }) || cur.State != api.LeaseActive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node2's part not lost within a minute: %+v", cur)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	if cur.State != api.LeaseActive {
		t.Fatalf("the bond's lease after node2 went down: %s (%s)", cur.State, cur.Reason)
	}
	for _, p := range cur.Parts {
		if p.Lost() != (p.NodeID == down) {
			t.Fatalf("parts after node2 went down (%s): %+v", down, cur.Parts)
		}
	}
	for !strings.Contains(a.log(), "lost (its lender's node is down)") {
		select {
		case <-a.done:
			t.Fatalf("attach ended with the node: %s", a.log())
		case <-ctx.Done():
			t.Fatalf("the borrower did not drop the lost lender: %s", a.log())
		case <-time.After(50 * time.Millisecond):
		}
	}
	bps, _, err = n.iperf(ctx, b, 5304, "-t", "3", "-P", "4")
	if err != nil {
		t.Fatalf("TCP once node2 is down: %v\n%s", err, a.log())
	}
	udp, lost, err = n.iperf(ctx, b, 5305, "-u", "-b", "10M", "-t", "2")
	if err != nil {
		t.Fatalf("UDP once node2 is down: %v", err)
	}
	t.Logf("node2 down, its part lost: TCP %.1f Mbit/s; UDP %.1f Mbit/s, %.1f%% lost", bps/1e6, udp/1e6, lost)
	if bps < 5e6 || udp < 5e6 || lost > 20 {
		t.Errorf("through the surviving lenders once node2 is down: TCP %.1f Mbit/s, UDP %.1f Mbit/s (%.1f%% lost)", bps/1e6, udp/1e6, lost)
	}
	select {
	case <-a.done:
		t.Fatalf("attach ended: %s", a.log())
	default:
	}
	n.detach(ctx, a, l.ID)
}
