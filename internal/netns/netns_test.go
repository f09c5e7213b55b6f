package netns

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func newLab(t *testing.T, cfg Config) *Lab {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		assertGone(t, l)
	})
	return l
}

func assertGone(t *testing.T, l *Lab) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), l.ID()) {
		t.Errorf("namespaces left after Close:\n%s", out)
	}
	out, err = exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "rl"+l.ID()) {
		t.Errorf("links left after Close:\n%s", out)
	}
}

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"400mbit", 400e6, false},
		{"1gbit", 1e9, false},
		{"1.5Mbit", 1.5e6, false},
		{"10mbps", 80e6, false},
		{"1000", 1000, false},
		{"8", 8, false},
		{"1", 0, true},
		{"0.5kbit", 500, false},
		{"", 0, true},
		{"fast", 0, true},
		{"10furlongs", 0, true},
		{"-5mbit", 0, true},
	} {
		got, err := ParseRate(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d, err=%v", tc.in, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrBadConfig) {
			t.Errorf("ParseRate(%q) error %v does not wrap ErrBadConfig", tc.in, err)
		}
	}
}

func TestBadConfig(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	for _, cfg := range []Config{{Hosts: 0}, {Hosts: MaxHosts + 1}, {Hosts: 1, Rate: "quick"}, {Hosts: 1, HostRates: []string{"1mbit", "2mbit"}}} {
		if _, err := New(context.Background(), cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("New(%+v) = %v, want ErrBadConfig", cfg, err)
		}
	}
}

// TestLab builds three hosts and checks addressing, reachability from the
// root namespace and between hosts, Command, and that the links are shaped.
func TestLab(t *testing.T) {
	l := newLab(t, Config{Hosts: 3, Rate: "40mbit", HostRates: []string{"", "", "400mbit"}, CongestionControl: "reno"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if got := l.Host(1).Addr.As4(); got[0] != 10 || got[1] != 213 || got[3] != 3 {
		t.Errorf("host 1 addr = %v", l.Host(1).Addr)
	}
	if !l.Prefix().Contains(l.Gateway()) {
		t.Errorf("gateway %v outside %v", l.Gateway(), l.Prefix())
	}
	out, err := l.Command(ctx, 2, "ip", "-o", "-4", "addr", "show", "dev", "eth0").CombinedOutput()
	if err != nil {
		t.Fatalf("Command: %v: %s", err, out)
	}
	if !strings.Contains(string(out), l.Host(2).Addr.String()+"/24") {
		t.Errorf("host 2 eth0: %s", out)
	}
	for _, args := range [][]string{{"ip", "route", "show", l.Prefix().String()}, {"ip", "-n", l.Host(0).Namespace, "route", "show"}} {
		out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "congctl reno") {
			t.Errorf("%v: congestion control not set: %v: %s", args, err, out)
		}
	}
	out, err = l.Command(ctx, 0, "tc", "qdisc", "show", "dev", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "40Mbit") {
		t.Errorf("host 0 qdisc: %v: %s", err, out)
	}

	// A listener in host 1, reached from the root namespace and from host 0.
	ln, err := l.Listen(ctx, 1, "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	addr := net.JoinHostPort(l.Host(1).Addr.String(), itoa(port))
	type result struct {
		n   int64
		err error
	}
	accepted := make(chan result, 2)
	go func() {
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				accepted <- result{0, err}
				return
			}
			n, err := io.Copy(io.Discard, c)
			c.Close()
			accepted <- result{n, err}
		}
	}()
	// From the root namespace: 2 MiB through a 40 Mbit/s link takes at
	// least ~0.4 s; unshaped it would take a few milliseconds.
	const size = 2 << 20
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Write(bytes.Repeat([]byte{7}, size)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	r := <-accepted
	el := time.Since(start)
	if r.err != nil || r.n != size {
		t.Fatalf("root→host1: %d bytes, %v", r.n, r.err)
	}
	if rate := float64(size*8) / el.Seconds(); rate > 40e6*1.5 {
		t.Errorf("root→host1 at %.0f Mbit/s through a 40 Mbit/s link", rate/1e6)
	}
	// Host to host.
	c, err = l.Dial(ctx, 0, "tcp", addr)
	if err != nil {
		t.Fatalf("host0→host1: %v", err)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if r := <-accepted; r.err != nil || r.n != 5 {
		t.Fatalf("host0→host1: %d bytes, %v", r.n, r.err)
	}
}

// TestCloseKillsProcesses checks that Close ends a process left running in a
// host and still removes everything.
func TestCloseKillsProcesses(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	l, err := New(context.Background(), Config{Hosts: 1})
	if err != nil {
		t.Fatal(err)
	}
	cmd := l.Command(context.Background(), 0, "sleep", "600")
	if err := cmd.Start(); err != nil {
		l.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// `ip netns exec` enters the namespace and then execs sleep under the
	// same pid: wait until the namespace lists it, or Close could run
	// before there is anything in the namespace to kill.
	pid := strconv.Itoa(cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := exec.Command("ip", "netns", "pids", l.Host(0).Namespace).Output()
		if slices.Contains(strings.Fields(string(out)), pid) {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			l.Close()
			t.Fatal("process never appeared in the namespace")
		}
		runtime.Gosched()
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("process in namespace survived Close")
	}
	assertGone(t, l)
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestPurge builds a lab with a chosen ID and subnet, starts a process in
// it, and then, as if the builder had crashed, removes it with Purge alone:
// the process dies and no namespace or link of the lab is left.
func TestPurge(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := NewID()
	if err != nil {
		t.Fatal(err)
	}
	// Find a free subnet by building a lab, then ask for that one.
	probe, err := New(ctx, Config{Hosts: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := probe.Prefix()
	if err := probe.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := New(ctx, Config{Hosts: 2, ID: id, Subnet: want, Prefix: "rialto-purge"})
	if err != nil {
		t.Fatal(err)
	}
	crashed := true
	defer func() {
		if crashed {
			l.Close()
		}
	}()
	if l.ID() != id || l.Prefix() != want {
		t.Errorf("lab %s on %v, want %s on %v", l.ID(), l.Prefix(), id, want)
	}
	nss, links, err := Leftovers(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(nss) != 2 || len(links) != 3 {
		t.Fatalf("Leftovers of a live lab: %v %v (want 2 namespaces, 2 veths and a bridge)", nss, links)
	}
	cmd := l.Command(context.Background(), 1, "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitInNamespace(t, l.Host(1).Namespace, cmd.Process.Pid)

	if err := Purge(ctx, id, nil); err != nil {
		t.Fatalf("Purge: %v", err)
	}
	crashed = false
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("process in a purged namespace survived")
	}
	assertGone(t, l)
	if nss, links, err := Leftovers(ctx, id); err != nil || len(nss)+len(links) != 0 {
		t.Fatalf("after Purge: %v %v %v", nss, links, err)
	}
	// Purging again finds nothing and is not an error.
	if err := Purge(ctx, id, nil); err != nil {
		t.Fatalf("second Purge: %v", err)
	}
	for _, bad := range []string{"", "ABCDEF", "abc", "abcdefg", "../x12"} {
		if err := Purge(ctx, bad, nil); !errors.Is(err, ErrBadConfig) {
			t.Errorf("Purge(%q) = %v, want ErrBadConfig", bad, err)
		}
	}
}

func TestBadIDAndSubnet(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	for _, cfg := range []Config{
		{Hosts: 1, ID: "XYZ123"},
		{Hosts: 1, ID: "12345"},
		{Hosts: 1, Subnet: netip.MustParsePrefix("192.168.1.0/24")},
		{Hosts: 1, Subnet: netip.MustParsePrefix("10.213.0.0/16")},
	} {
		if _, err := New(context.Background(), cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("New(%+v) = %v, want ErrBadConfig", cfg, err)
		}
	}
}

// TestCounters sends a known number of bytes from the root namespace to a
// host and back and reads them in the link's counters.
func TestCounters(t *testing.T) {
	l := newLab(t, Config{Hosts: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := l.Listen(ctx, 0, "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const up, down = 3 << 20, 1 << 20
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		if _, err := io.CopyN(io.Discard, c, up); err != nil {
			served <- err
			return
		}
		_, err = c.Write(make([]byte, down))
		served <- err
	}()
	before, err := l.Counters(0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(l.Host(0).Addr.String(), itoa(ln.Addr().(*net.TCPAddr).Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(make([]byte, up)); err != nil {
		t.Fatal(err)
	}
	if n, err := io.CopyN(io.Discard, c, down); err != nil || n != down {
		t.Fatalf("read back %d: %v", n, err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	after, err := l.Counters(0)
	if err != nil {
		t.Fatal(err)
	}
	// Payload plus headers: at least the payload, and not more than
	// double (TCP/IP/Ethernet overhead and ACKs are a few percent).
	if d := after.ToHost - before.ToHost; d < up || d > 2*up {
		t.Errorf("ToHost grew by %d for %d bytes sent", d, up)
	}
	if d := after.FromHost - before.FromHost; d < down || d > 2*down {
		t.Errorf("FromHost grew by %d for %d bytes received", d, down)
	}
}

// waitInNamespace waits until ip netns pids lists pid in ns.
func waitInNamespace(t *testing.T, ns string, pid int) {
	t.Helper()
	want := strconv.Itoa(pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		if slices.Contains(strings.Fields(string(out)), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d never appeared in %s", pid, ns)
		}
		runtime.Gosched()
	}
}

// TestOutside: uplinked hosts reach the outside's Server, others and the
// root namespace do not; Close removes the outside with the lab.
func TestOutside(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox not installed")
	}
	l := newLab(t, Config{Hosts: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := l.AddOutside(ctx, OutsideConfig{Hosts: []int{1}, Rate: "50mbit"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AddOutside(ctx, OutsideConfig{Hosts: []int{0}}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("a second outside: %v", err)
	}
	ping := func(cmd *exec.Cmd) bool { return cmd.Run() == nil }
	srv := o.Server.String()
	if !ping(l.Command(ctx, 1, "busybox", "ping", "-c", "1", "-W", "2", srv)) {
		t.Error("the uplinked host does not reach the outside")
	}
	if ping(l.Command(ctx, 0, "busybox", "ping", "-c", "1", "-W", "1", srv)) {
		t.Error("a host without an uplink reaches the outside")
	}
	if ping(exec.CommandContext(ctx, "busybox", "ping", "-c", "1", "-W", "1", srv)) {
		t.Error("the root namespace reaches the outside")
	}
	nss, _, err := Leftovers(ctx, l.ID())
	if err != nil || !slices.Contains(nss, o.Namespace) {
		t.Errorf("Leftovers does not list the outside %s: %v, %v", o.Namespace, nss, err)
	}
}
