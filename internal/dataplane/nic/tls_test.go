package nic

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// testCA is a cluster CA of the tests.
type testCA struct {
	ca *pki.CA
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{ca: ca}
}

// issue returns a node certificate for host and its key.
func (c *testCA) issue(t *testing.T, host string) (certPEM, keyPEM []byte) {
	t.Helper()
	iss, err := c.ca.Issue(pki.Request{CommonName: "node-" + host, Hosts: []string{host}, Usage: pki.ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	return iss.CertPEM, iss.KeyPEM
}

func (c *testCA) pem() []byte { return c.ca.CertPEM() }

// startTLSLender starts lender k with a node certificate of ca for its
// address (the host of its URI).
func (r *rack) startTLSLender(t *testing.T, k int, ca *testCA, leases ...LeaseSpec) *proc {
	t.Helper()
	cert, key := ca.issue(t, r.lab.Host(lender0+k).Addr.String())
	p, line := startHelper(t, r.lab, lender0+k, "lender", lenderSpec{Iface: "wan0", Listen: r.lenderAddr(k), Leases: leases, CertPEM: cert, KeyPEM: key})
	if line != "ready" {
		t.Fatalf("lender %d: %q", k, line)
	}
	return p
}

// udpPacket is an IPv4 UDP packet from src to dst carrying payload (no
// UDP checksum, which IPv4 allows).
func udpPacket(src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 28+len(payload))
	b[0], b[8], b[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(b[10:], ^uint16(sum))
	binary.BigEndian.PutUint16(b[20:], src.Port())
	binary.BigEndian.PutUint16(b[22:], dst.Port())
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(payload)))
	copy(b[28:], payload)
	return b
}

// forgedRecord is a TLS application-data record whose body is a DATA
// frame carrying pkt in clear: what an attacker without the session's
// keys can put on the wire.
func forgedRecord(pkt []byte) []byte {
	var h [HeaderSize]byte
	Header{Type: FrameData, Length: uint16(len(pkt))}.Encode(h[:])
	body := append(h[:], pkt...)
	rec := []byte{23, 3, 3, 0, 0}
	binary.BigEndian.PutUint16(rec[3:], uint16(len(body)))
	return append(rec, body...)
}

// udpEnds are a UDP socket in the borrower's namespace (host 0),
// connected to one on the outside's server: traffic between them crosses
// the lent NIC.
type udpEnds struct {
	b, o *net.UDPConn
	bAt  netip.AddrPort // the borrower's socket, as the lender's kernel sees it
	oAt  netip.AddrPort // the outside's socket
	from *net.UDPAddr   // the borrower's socket as the outside sees it (NAT)
	seen [][]byte       // datagrams sent so far (a late copy of one is no news)
}

func newUDPEnds(t *testing.T, r *rack, borrowerAddr netip.Addr) *udpEnds {
	t.Helper()
	u := &udpEnds{bAt: netip.AddrPortFrom(borrowerAddr, 7401), oAt: netip.AddrPortFrom(r.out.Server, 7400)}
	if err := r.out.Do(func() error {
		var err error
		u.o, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(u.oAt))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.o.Close() })
	if err := r.lab.Do(0, func() error {
		var err error
		u.b, err = net.DialUDP("udp4", &net.UDPAddr{Port: int(u.bAt.Port())}, net.UDPAddrFromAddrPort(u.oAt))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.b.Close() })
	return u
}

// up sends msg from the borrower until the outside gets a datagram that
// is not a copy of an earlier one, and returns that datagram.
func (u *udpEnds) up(t *testing.T, msg []byte) []byte {
	t.Helper()
	return u.exchange(t, msg, func() error { _, err := u.b.Write(msg); return err }, u.o)
}

// down sends msg from the outside to the borrower (through the NAT
// mapping the borrower's first datagram made) likewise.
func (u *udpEnds) down(t *testing.T, msg []byte) []byte {
	t.Helper()
	if u.from == nil {
		t.Fatal("no datagram went up yet: the outside cannot answer")
	}
	return u.exchange(t, msg, func() error { _, err := u.o.WriteToUDP(msg, u.from); return err }, u.b)
}

func (u *udpEnds) exchange(t *testing.T, msg []byte, send func() error, rc *net.UDPConn) []byte {
	t.Helper()
	buf := make([]byte, 2048)
	for try := 0; try < 20; try++ {
		if err := send(); err != nil {
			t.Fatal(err)
		}
		// Each try waits a second for the datagram: a lost one is sent
		// again.
		_ = rc.SetReadDeadline(time.Now().Add(time.Second))
		for {
			n, from, err := rc.ReadFromUDP(buf)
			if err != nil {
				break
			}
			got := bytes.Clone(buf[:n])
			stale := false
			for _, s := range u.seen {
				stale = stale || bytes.Equal(got, s)
			}
			if stale {
				continue
			}
			if rc == u.o && bytes.Equal(got, msg) {
				u.from = from
			}
			u.seen = append(u.seen, msg)
			return got
		}
	}
	t.Fatalf("%q did not cross the lent NIC", msg)
	return nil
}

// waitRedialled waits until the borrower is up on its n-th connection
// through the relay.
func waitRedialled(t *testing.T, pb *proc, rl *relay, n int32) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if rl.accepts.Load() >= n && pb.report(t).Members[0].Up {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the borrower is not back up on connection %d (%d accepted): %+v", n, rl.accepts.Load(), pb.report(t).Members[0])
		}
		<-tick.C
	}
}

// waitEnded waits until the relayed connection c is over.
func waitEnded(t *testing.T, c *relayConn, what string) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: the connection goes on", what)
	}
}

// TestTLSTunnelOnPath: an attacker on the path between a borrower and a
// lender whose tunnel runs under TLS (a relay that records and tampers
// at TLS record boundaries) sees neither the packets' contents, nor the
// handshake's frames, nor the credential; a record it injects (a DATA
// frame in clear carrying a packet for the lender's kernel, or for the
// borrower's) or a byte it flips ends the connection, and the packets
// never reach a kernel: the borrower redials, and the next datagram
// through the tunnel is the genuine one. TestOnPathAttackerOfPlaintextTunnel
// shows the same attacks succeed on a plaintext tunnel.
func TestTLSTunnelOnPath(t *testing.T) {
	r := newRack(t, 1, "")
	ca := newTestCA(t)
	la := testLease("tls-on-path", 0)
	r.startTLSLender(t, 0, ca, la)
	rl := startFramingRelay(t, net.JoinHostPort(r.lab.Gateway().String(), "0"), r.lenderAddr(0), tlsRecord)
	pb, rep := r.attach(t, 0, borrowerSpec{Members: []Member{{Addr: rl.ln.Addr().String(), Credential: la.Credential, TLS: true}},
		Name: "rnic0", CAPEM: ca.pem(), ServerName: r.lab.Host(lender0).Addr.String()})
	u := newUDPEnds(t, r, rep.Addr)

	// Packets cross both ways; the relay sees none of them in clear.
	payUp := []byte("known payload, borrower to outside: 3c1f9e0a")
	payDown := []byte("known payload, outside to borrower: 77d0b2e4")
	if got := u.up(t, payUp); !bytes.Equal(got, payUp) {
		t.Fatalf("the outside got %q", got)
	}
	if got := u.down(t, payDown); !bytes.Equal(got, payDown) {
		t.Fatalf("the borrower got %q", got)
	}
	sent, recv := rl.recordedAll(0), rl.recordedAll(1)
	for _, c := range []struct {
		what   string
		record []byte
		clear  []byte
	}{
		{"the borrower's packet", sent, payUp},
		{"the outside's packet", recv, payDown},
		{"the credential", sent, []byte(la.Credential)},
		{"the HELLO's magic", sent, []byte("RNIC")},
		{"the WELCOME's magic", recv, []byte("RNIC")},
	} {
		if bytes.Contains(c.record, c.clear) {
			t.Errorf("%s crossed the relay in clear", c.what)
		}
	}

	// A forged record for the lender's kernel ends the connection.
	c1 := rl.latest()
	injUp := []byte("INJECTED toward the outside")
	if err := c1.pipes[0].inject(forgedRecord(udpPacket(u.bAt, u.oAt, injUp))); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, c1, "a forged record to the lender")
	waitRedialled(t, pb, rl, 2)
	if got, want := u.up(t, []byte("genuine, after the injection toward the lender")), "genuine, after the injection toward the lender"; string(got) != want {
		t.Fatalf("the outside got %q before the genuine datagram: the injected packet reached the lender's kernel", got)
	}

	// A forged record for the borrower's kernel likewise.
	c2 := rl.latest()
	injDown := []byte("INJECTED toward the borrower")
	if err := c2.pipes[1].inject(forgedRecord(udpPacket(u.oAt, u.bAt, injDown))); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, c2, "a forged record to the borrower")
	waitRedialled(t, pb, rl, 3)
	if got, want := u.down(t, []byte("genuine, after the injection toward the borrower")), "genuine, after the injection toward the borrower"; string(got) != want {
		t.Fatalf("the borrower got %q before the genuine datagram: the injected packet reached its kernel", got)
	}

	// A flipped byte in the borrower's next record likewise: the packet
	// it carried (or any after it) never reaches the outside.
	c3 := rl.latest()
	c3.pipes[0].flipNext()
	if _, err := u.b.Write([]byte("FLIPPED on the way")); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, c3, "a flipped byte")
	waitRedialled(t, pb, rl, 4)
	if got, want := u.up(t, []byte("genuine, after the flip")), "genuine, after the flip"; string(got) != want {
		t.Fatalf("the outside got %q before the genuine datagram", got)
	}
}

// TestOnPathAttackerOfPlaintextTunnel is TestTLSTunnelOnPath's control:
// on a plaintext tunnel (--insecure-dataplane) the same relay reads the
// packets and a DATA frame it injects reaches the lender's kernel and the
// outside, so TestTLSTunnelOnPath's attacks are real ones.
func TestOnPathAttackerOfPlaintextTunnel(t *testing.T) {
	r := newRack(t, 1, "")
	la := testLease("plain-on-path", 0)
	r.startLender(t, 0, la)
	rl := startFramingRelay(t, net.JoinHostPort(r.lab.Gateway().String(), "0"), r.lenderAddr(0), plainNIC)
	_, rep := r.attach(t, 0, borrowerSpec{Members: []Member{{Addr: rl.ln.Addr().String(), Credential: la.Credential}}, Name: "rnic0"})
	u := newUDPEnds(t, r, rep.Addr)
	payUp := []byte("known payload, borrower to outside: 3c1f9e0a")
	if got := u.up(t, payUp); !bytes.Equal(got, payUp) {
		t.Fatalf("the outside got %q", got)
	}
	if !bytes.Contains(rl.recordedAll(0), payUp) {
		t.Error("the relay does not see the plaintext tunnel's packet: it proves nothing of the TLS one")
	}
	inj := []byte("INJECTED toward the outside")
	if err := rl.latest().pipes[0].injectData(udpPacket(u.bAt, u.oAt, inj)); err != nil {
		t.Fatal(err)
	}
	if got := u.up(t, []byte("genuine, after the injection")); !bytes.Equal(got, inj) {
		t.Errorf("the outside got %q, not the injected packet: the relay's injection proves nothing", got)
	}
}

// TestBorrowerRefusesUntrustedLender: a borrower whose lease names a TLS
// tunnel refuses a lender whose certificate another CA signed, and one
// that does not speak TLS, saying so; a TLS lender answers a plaintext
// HELLO with StatusTLS.
func TestBorrowerRefusesUntrustedLender(t *testing.T) {
	r := newRack(t, 2, "")
	cluster, other := newTestCA(t), newTestCA(t)
	la, lb := testLease("wrong-ca", 0), testLease("plaintext", 0)
	r.startTLSLender(t, 0, other, la)
	r.startLender(t, 1, lb)
	tcfg, err := clientTLSConfig(cluster.pem(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		m    Member
		sent error
		want string
	}{
		{"a lender with another CA's certificate", Member{Addr: r.lenderAddr(0), Credential: la.Credential, TLS: true},
			ErrTLS, "certificate was not accepted (signed by an unknown authority)"},
		{"a plaintext lender", Member{Addr: r.lenderAddr(1), Credential: lb.Credential, TLS: true},
			ErrTLS, "does not speak TLS"},
		// The other way round: a plaintext HELLO to a TLS lender.
		{"a plaintext borrower of a TLS lender", Member{Addr: r.lenderAddr(0), Credential: la.Credential},
			ErrTLSRequired, "rialto-nics://"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var ifc *Interface
		err := r.lab.Do(0, func() error {
			var err error
			ifc, err = Attach(ctx, Config{Members: []Member{c.m}, Name: "rnic0", TLS: staticTLS(tcfg)})
			return err
		})
		cancel()
		if err == nil {
			ifc.Close()
			t.Errorf("%s: attached", c.what)
			continue
		}
		if !errors.Is(err, c.sent) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.m.Addr) {
			t.Errorf("%s: %v, want %v naming the lender and saying %q", c.what, err, c.sent, c.want)
		}
		if strings.Contains(err.Error(), c.m.Credential) {
			t.Errorf("%s: the error quotes the credential: %v", c.what, err)
		}
	}
}

// TestAttachTLSNeedsCA: a TLS member without Config.TLS is refused
// before anything is dialled.
func TestAttachTLSNeedsCA(t *testing.T) {
	_, err := Attach(context.Background(), Config{Members: []Member{{Addr: "192.0.2.1:7300", Credential: "c", TLS: true}}})
	if !errors.Is(err, ErrNoCA) || !strings.Contains(err.Error(), "rialto-nics://") {
		t.Fatalf("Attach: %v, want ErrNoCA naming rialto-nics://", err)
	}
}
