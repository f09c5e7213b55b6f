package nic

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/netns"
)

// rack is the lab of the namespace tests: hosts 0 and 1 are borrowers,
// hosts 2.. lenders whose wan0 uplinks lead to the outside, where an
// iperf3 server runs on Server (reachable only through a lender).
type rack struct {
	lab *netns.Lab
	out *netns.Outside
}

const lender0 = 2

func newRack(t *testing.T, lenders int, uplinkRate string) *rack {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	if err := Available(); err != nil {
		t.Skip(err)
	}
	for _, tool := range []string{"iperf3", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lab, err := netns.New(ctx, netns.Config{Hosts: lender0 + lenders, Prefix: "rialto-nic"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	var hosts []int
	for k := range lenders {
		hosts = append(hosts, lender0+k)
	}
	out, err := lab.AddOutside(ctx, netns.OutsideConfig{Hosts: hosts, Rate: uplinkRate})
	if err != nil {
		t.Fatal(err)
	}
	return &rack{lab: lab, out: out}
}

func (r *rack) lenderAddr(k int) string {
	return net.JoinHostPort(r.lab.Host(lender0+k).Addr.String(), "7300")
}

func (r *rack) startLender(t *testing.T, k int, leases ...LeaseSpec) *proc {
	p, line := startHelper(t, r.lab, lender0+k, "lender", lenderSpec{Iface: "wan0", Listen: r.lenderAddr(k), Leases: leases})
	if line != "ready" {
		t.Fatalf("lender %d: %q", k, line)
	}
	return p
}

func (r *rack) attach(t *testing.T, host int, spec borrowerSpec) (*proc, borrowerReport) {
	p, line := startHelper(t, r.lab, host, "borrower", spec)
	var rep borrowerReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		t.Fatalf("borrower on host %d: %v: %q", host, err, line)
	}
	return p, rep
}

// iperfServer runs a one-off iperf3 server on the outside's Server address.
func (r *rack) iperfServer(t *testing.T, port int) {
	t.Helper()
	cmd := r.out.Command(context.Background(), "iperf3", "-s", "-1", "--forceflush", "-B", r.out.Server.String(), "-p", strconv.Itoa(port))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	br := bufio.NewReader(stdout)
	for {
		line, err := readLine(br, 10*time.Second)
		if err != nil {
			t.Fatalf("iperf3 server: %v", err)
		}
		if strings.Contains(line, "Server listening") {
			go func() { _, _ = br.WriteTo(discard{}) }()
			return
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

type iperfResult struct {
	bps  float64 // received bits/s
	lost float64 // UDP: percent lost
}

// iperf runs an iperf3 client from host against the outside's server.
func (r *rack) iperf(t *testing.T, host, port int, args ...string) (iperfResult, error) {
	t.Helper()
	r.iperfServer(t, port)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := append([]string{"-c", r.out.Server.String(), "-p", strconv.Itoa(port), "-J", "--connect-timeout", "3000"}, args...)
	out, err := r.lab.Command(ctx, host, "iperf3", a...).Output()
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
		return iperfResult{}, fmt.Errorf("iperf3 %v: %v (%v)", a, err, jerr)
	}
	if j.Error != "" {
		return iperfResult{}, fmt.Errorf("iperf3 %v: %s", a, j.Error)
	}
	if err != nil {
		return iperfResult{}, fmt.Errorf("iperf3 %v: %w", a, err)
	}
	res := iperfResult{bps: j.End.SumReceived.BPS}
	if res.bps == 0 {
		res.bps, res.lost = j.End.Sum.BPS, j.End.Sum.Lost
	}
	return res, nil
}

// ping reports whether host gets an answer from dst (one try, 1 s).
func (r *rack) ping(host int, dst string, extra ...string) bool {
	args := append([]string{"ping", "-c", "1", "-W", "1"}, extra...)
	return r.lab.Command(context.Background(), host, "busybox", append(args, dst)...).Run() == nil
}

func testLease(id string, rate uint64) LeaseSpec {
	return LeaseSpec{ID: id, Credential: "cred-" + id + "-0123456789abcdef", Rate: rate}
}

func testMember(r *rack, k int, l LeaseSpec) Member {
	return Member{Addr: r.lenderAddr(k), Credential: l.Credential}
}

// TestLentNIC: iperf3 (TCP and UDP) from a borrower namespace through a
// lent NIC to a host reachable only through the lender; borrowers cannot
// reach each other, nor the lender's addresses, nor see each other's or
// the lender's traffic; a lease's rate cap holds.
func TestLentNIC(t *testing.T) {
	r := newRack(t, 1, "")
	la, lb, lc := testLease("a", 0), testLease("b", 0), testLease("c", 24_000_000)
	r.startLender(t, 0, la, lb, lc)
	server := r.out.Server.String()
	if r.ping(0, server) {
		t.Fatal("the outside answers the borrower before any attach: the test proves nothing")
	}

	pa, repA := r.attach(t, 0, borrowerSpec{Members: []Member{testMember(r, 0, la)}, Name: "rnic0"})
	if !r.ping(0, server) {
		t.Fatal("no ping through the lent NIC")
	}
	tcp, err := r.iperf(t, 0, 5201, "-t", "1")
	if err != nil {
		t.Fatal(err)
	}
	if tcp.bps < 1e6 {
		t.Fatalf("TCP through the lent NIC: %.0f bit/s", tcp.bps)
	}
	udp, err := r.iperf(t, 0, 5202, "-u", "-b", "20M", "-t", "1")
	if err != nil {
		t.Fatal(err)
	}
	if udp.bps < 5e6 || udp.lost > 20 {
		t.Fatalf("UDP through the lent NIC: %.0f bit/s, %.1f%% lost", udp.bps, udp.lost)
	}
	t.Logf("TCP %.1f Mbit/s, UDP %.1f Mbit/s (%.2f%% lost)", tcp.bps/1e6, udp.bps/1e6, udp.lost)

	// A second borrower of the same lender.
	pb, repB := r.attach(t, 1, borrowerSpec{Members: []Member{testMember(r, 0, lb)}, Name: "rnic0"})
	if repA.Addr == repB.Addr {
		t.Fatalf("two leases share address %v", repA.Addr)
	}
	lenderWAN := r.out.Uplinks[0].Addr.String()
	lenderRack := r.lab.Host(lender0).Addr.String()
	for _, c := range []struct {
		what string
		dst  string
		args []string
	}{
		{"the other borrower's tunnel address", repA.Addr.String(), []string{"-I", "rnic0"}},
		{"the lender's address on the lent interface", lenderWAN, nil},
		{"the lender's rack address through the tunnel", lenderRack, []string{"-I", "rnic0"}},
	} {
		if r.ping(1, c.dst, c.args...) {
			t.Errorf("borrower b reaches %s (%s)", c.what, c.dst)
		}
	}
	if !r.ping(1, server) {
		t.Error("borrower b cannot reach the outside")
	}
	// Nothing of a's traffic, nor of the lender's own, reaches b.
	before := pb.report(t).Stats.RxPackets
	if _, err := r.iperf(t, 0, 5203, "-t", "1"); err != nil {
		t.Fatal(err)
	}
	if err := r.lab.Command(context.Background(), lender0, "busybox", "ping", "-c", "3", server).Run(); err != nil {
		t.Fatalf("the lender's own ping: %v", err)
	}
	if after := pb.report(t).Stats.RxPackets; after != before {
		t.Errorf("borrower b received %d packets while only a and the lender used the NIC", after-before)
	}
	// b forges a's address: the lender drops it, so no answer reaches a.
	aBefore := pa.report(t).Stats.RxPackets
	if err := r.lab.Do(1, func() error { return sendForgedPings(repA.Addr, r.out.Server, 20) }); err != nil {
		t.Fatal(err)
	}
	if !r.ping(1, server) { // b's own traffic still flows (and the forged pings had time to be answered)
		t.Error("borrower b lost the outside after forging")
	}
	if got := pa.report(t).Stats.RxPackets - aBefore; got != 0 {
		t.Errorf("borrower a received %d packets after b forged its address", got)
	}

	// The rate cap: lease c is capped at 24 Mbit/s.
	// (Its routes replace b's on host 1: the same prefixes, a newer interface.)
	_, repC := r.attach(t, 1, borrowerSpec{Members: []Member{testMember(r, 0, lc)}, Name: "rnic1"})
	capped, err := r.iperf(t, 1, 5204, "-t", "2", "-B", repC.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capped lease: %.1f Mbit/s", capped.bps/1e6)
	if capped.bps > 24e6*1.1 || capped.bps < 24e6*0.3 {
		t.Errorf("lease capped at 24 Mbit/s carried %.1f Mbit/s", capped.bps/1e6)
	}
}

// TestBond: three lenders composed into one interface; it carries TCP
// and UDP, and survives one lender's SIGKILL.
func TestBond(t *testing.T) {
	for _, mode := range []Mode{ModeFlow, ModePacket} {
		t.Run(string(mode), func(t *testing.T) {
			r := newRack(t, 3, "")
			var members []Member
			var lenders []*proc
			for k := range 3 {
				l := testLease("bond"+strconv.Itoa(k), 0)
				lenders = append(lenders, r.startLender(t, k, l))
				members = append(members, testMember(r, k, l))
			}
			pb, rep := r.attach(t, 0, borrowerSpec{Members: members, Mode: mode, Name: "rbond0"})
			waitMembers(t, pb, 3)
			if !rep.Addr.IsValid() {
				t.Fatal("no address")
			}
			if _, err := r.iperf(t, 0, 5301, "-t", "1", "-P", "6"); err != nil {
				t.Fatal(err)
			}
			st := pb.report(t)
			used := 0
			for _, m := range st.Members {
				if m.Stats.TxPackets > 100 {
					used++
				}
			}
			if used < 2 {
				t.Errorf("6 flows used %d of 3 lenders: %+v", used, st.Members)
			}
			if mode == ModePacket {
				t.Logf("reordered %d of %d packets", st.Stats.Reordered, st.Stats.RxPackets)
			}

			_ = lenders[1].cmd.Process.Signal(syscall.SIGKILL)
			<-lenders[1].done
			waitMembers(t, pb, 2)
			if _, err := r.iperf(t, 0, 5302, "-t", "1", "-P", "4"); err != nil {
				t.Fatalf("TCP after a lender's SIGKILL: %v", err)
			}
			udp, err := r.iperf(t, 0, 5303, "-u", "-b", "20M", "-t", "1")
			if err != nil {
				t.Fatalf("UDP after a lender's SIGKILL: %v", err)
			}
			if udp.lost > 20 {
				t.Errorf("UDP after a lender's SIGKILL: %.1f%% lost", udp.lost)
			}
			// The lender comes back (its lease restored, as a restarted
			// agent restores it): the bond takes it in again.
			r.startLender(t, 1, testLease("bond1", 0))
			waitMembers(t, pb, 3)
			if _, err := r.iperf(t, 0, 5304, "-t", "1", "-P", "6"); err != nil {
				t.Fatalf("TCP after the lender's return: %v", err)
			}
			if mode != ModeFlow {
				return
			}
			// Its part declared lost, the lender is dropped for good: the
			// bond goes on with the others and does not redial it.
			if rep := pb.command(t, "drop 1"); !rep.Members[1].Dropped || rep.Members[1].Up {
				t.Fatalf("after Drop(1): %+v", rep.Members[1])
			}
			waitMembers(t, pb, 2)
			if _, err := r.iperf(t, 0, 5305, "-t", "1", "-P", "4"); err != nil {
				t.Fatalf("TCP after a lender was dropped: %v", err)
			}
			if rep := pb.report(t); rep.Members[1].Up || !rep.Members[1].Dropped {
				t.Fatalf("a dropped lender came back: %+v", rep.Members[1])
			}
		})
	}
}

// waitMembers polls until exactly n lenders of the borrower are up.
func waitMembers(t *testing.T, p *proc, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		rep := p.report(t)
		up := 0
		for _, m := range rep.Members {
			if m.Up {
				up++
			}
		}
		if up == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lenders up, want %d: %+v", up, n, rep.Members)
		}
		<-tick.C
	}
}

// sendForgedPings sends ICMP echo requests from src (an address this
// namespace does not have) to dst through the routing table, with a raw
// socket that writes its own IPv4 header.
func sendForgedPings(src, dst netip.Addr, n int) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	for i := range n {
		p := make([]byte, 28)
		p[0], p[1] = 0x45, 0
		binary.BigEndian.PutUint16(p[2:], 28)
		binary.BigEndian.PutUint16(p[4:], uint16(i))
		p[8], p[9] = 64, 1 // TTL, ICMP
		s4, d4 := src.As4(), dst.As4()
		copy(p[12:16], s4[:])
		copy(p[16:20], d4[:])
		binary.BigEndian.PutUint16(p[10:], checksum(p[:20]))
		p[20] = 8 // echo request
		binary.BigEndian.PutUint16(p[24:], 0x5249)
		binary.BigEndian.PutUint16(p[26:], uint16(i))
		binary.BigEndian.PutUint16(p[22:], checksum(p[20:]))
		if err := syscall.Sendto(fd, p, 0, &syscall.SockaddrInet4{Addr: d4}); err != nil {
			return err
		}
	}
	return nil
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
