package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestRevokedDonorEndsSession: a session over TLS whose connections are
// registered with a revocation list (Options.Track) is ended as soon as
// the list takes a revocation of its donor's certificate, the donor
// still serving: every connection of the session (control, sync, bulk,
// queue) is shut down then, each with a log line naming the donor's
// address and the certificate's serial number. A request then finds the
// session lost; the Following asks where the region is, finds it still
// at the revoked donor, redials once, fails the handshake against the
// list and gives up at once (an error wrapping pki.ErrRevoked, a log
// line saying so) rather than redialling for FollowConfig.Timeout, and
// never dials that donor again. A session on the same donor whose region
// the control plane moved to a donor not revoked follows it there.
func TestRevokedDonorEndsSession(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ca := memorytest.NewCA(t)
	revoked, revokedCert := tlsDonor(t, ca, "donor-revoked", size)
	kept, _ := tlsDonor(t, ca, "donor-kept", size)
	const movedCred = "lease-cred-moved-0123456789ab"
	if err := revoked.D.AddRegion(movedCred, size); err != nil {
		t.Fatal(err)
	}
	crl := pki.NewCRL([]*x509.Certificate{ca.Certificate()})
	if _, err := crl.Update(ca.CRLPEM()); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var dialer net.Dialer
	var mu sync.Mutex
	var conns []string // local→remote of every connection dialled
	var dials atomic.Int64
	opts := Options{Timeout: 10 * time.Second,
		TLS:   &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), VerifyConnection: crl.VerifyPeer},
		Track: crl.Tracker(log),
		Dialer: func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, "tcp", addr)
			if err == nil {
				mu.Lock()
				conns = append(conns, conn.LocalAddr().String()+" "+conn.RemoteAddr().String())
				mu.Unlock()
				if addr == revoked.Addr {
					dials.Add(1)
				}
			}
			return conn, err
		}}
	const followFor = 5 * time.Minute
	stays := &where{addr: revoked.Addr, cred: testCred}
	f, err := DialFollowing(ctx, revoked.Addr, testCred, opts, FollowConfig{Relocate: stays.relocate, Timeout: followFor, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	moves := &where{addr: revoked.Addr, cred: movedCred}
	g, err := DialFollowing(ctx, revoked.Addr, movedCred, opts, FollowConfig{Relocate: moves.relocate, Timeout: followFor, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	data := bytes.Repeat([]byte("revoked!"), 4096/8)
	for _, s := range []*Following{f, g} {
		for _, ch := range channels {
			if err := s.Write(ctx, ch, data, 0); err != nil {
				t.Fatalf("%v: %v", ch, err)
			}
		}
	}
	mu.Lock()
	session := append([]string(nil), conns...)
	mu.Unlock()
	// control, sync, the bulk streams and the queue pair's, each session
	want := 2 * (3 + f.Client().opts.Streams)
	if len(session) != want {
		t.Fatalf("%d connections dialled, want %d", len(session), want)
	}
	if live := establishedTCP(t, session); len(live) != want {
		t.Fatalf("%d of the sessions' %d connections established before the revocation: %v", len(live), want, live)
	}

	if err := ca.Revoke(revokedCert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	dials.Store(0)
	if took, err := crl.Update(ca.CRLPEM()); err != nil || !took {
		t.Fatalf("Update: %v, %v", took, err)
	}
	// Ended by the time the list is taken.
	if live := establishedTCP(t, session); len(live) > 0 {
		t.Fatalf("connections to the revoked donor still open once the list was taken: %v\n%s", live, logs.String())
	}
	var ended []string
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, "ending a TLS connection: its peer's certificate is revoked") {
			ended = append(ended, line)
		}
	}
	if len(ended) != want {
		t.Fatalf("%d connections ended, want the %d to the revoked donor:\n%s", len(ended), want, logs.String())
	}
	for _, line := range ended {
		if !strings.Contains(line, "peer="+revoked.Addr) || !strings.Contains(line, "serial="+revokedCert.SerialNumber.Text(16)) {
			t.Fatalf("the line ending a connection does not name the donor (%s) and its serial number: %s", revoked.Addr, line)
		}
	}

	start := time.Now()
	err = f.Read(ctx, ChannelSync, make([]byte, len(data)), 0)
	if !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("a read of the region left on the revoked donor: %v, want an error wrapping %v", err, pki.ErrRevoked)
	}
	if took := time.Since(start); took >= followFor {
		t.Fatalf("the donor was redialled for %v (the whole follow timeout) before the read failed", took)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials of the revoked donor after the revocation, want the 1 whose handshake failed", n)
	}
	if !strings.Contains(logs.String(), "the region's donor presents a revoked certificate: not opening a session there again") {
		t.Fatalf("the read failed (%v), but the log does not say the donor's certificate is revoked:\n%s", err, logs.String())
	}
	for _, ch := range channels {
		if err := f.Write(ctx, ch, data, 0); !errors.Is(err, pki.ErrRevoked) {
			t.Fatalf("%v: a write to the region left on the revoked donor: %v", ch, err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("the revoked donor was dialled again (%d dials since the revocation)", n)
	}

	// The other region moved to a donor not revoked: followed.
	moves.set(kept.Addr, testCred)
	if err := g.Write(ctx, ChannelAdaptive, data, 0); err != nil {
		t.Fatalf("a write to the region moved away from the revoked donor: %v", err)
	}
	if g.Moves() != 1 {
		t.Fatalf("%d moves, want 1", g.Moves())
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("the revoked donor was dialled again (%d dials since the revocation)", n)
	}
}

// tlsDonor serves a region of size bytes under testCred over TLS with a
// certificate ca issues for cn (for 127.0.0.1), until the test ends.
func tlsDonor(t *testing.T, ca *pki.CA, cn string, size int64) (*memorytest.Donor, *x509.Certificate) {
	t.Helper()
	iss, err := ca.Issue(pki.Request{CommonName: cn, Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return memorytest.StartTLS(t, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, size, 0), iss.Cert
}

// establishedTCP returns those of conns ("LOCAL REMOTE", IPv4 addresses)
// that this machine's TCP table holds established, or closed by the peer
// only (CLOSE_WAIT): not ended at this end.
func establishedTCP(t *testing.T, conns []string) []string {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no TCP table: %v", err)
	}
	defer f.Close()
	state := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st ...
		fl := strings.Fields(sc.Text())
		if len(fl) < 4 || fl[0] == "sl" {
			continue
		}
		state[procAddr(fl[1])+" "+procAddr(fl[2])] = fl[3]
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var live []string
	for _, c := range conns {
		if st := state[c]; st == "01" || st == "08" { // ESTABLISHED, CLOSE_WAIT
			live = append(live, c)
		}
	}
	return live
}

// procAddr is an address of /proc/net/tcp (0100007F:1F90) as ip:port.
func procAddr(s string) string {
	h, p, ok := strings.Cut(s, ":")
	if !ok || len(h) != 8 {
		return s
	}
	var b [4]byte
	for i := range b {
		fmt.Sscanf(h[2*(3-i):2*(3-i)+2], "%02X", &b[i])
	}
	var port int
	fmt.Sscanf(p, "%X", &port)
	return net.JoinHostPort(net.IP(b[:]).String(), fmt.Sprint(port))
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
