package nic

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// TestRevokedLenderDropped: a borrower whose tunnel connections are
// registered with its revocation list (Config.Track) ends them all as
// soon as it takes a list revoking the lender's certificate, the lender
// still serving, each with a log line naming the lender's address and
// the serial number; its redial fails the handshake against the list,
// and the lender is dropped, not redialled (a log line saying so, the
// member's status Dropped with why). Before, the tunnel went on carrying
// packets through the revoked lender until its connections broke.
func TestRevokedLenderDropped(t *testing.T) {
	r := newRack(t, 1, "")
	ca := newTestCA(t)
	la := testLease("revoked", 0)
	certPEM, keyPEM := ca.issue(t, r.lab.Host(lender0).Addr.String())
	certs, err := pki.ParseCerts(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	serial := certs[0].SerialNumber
	if _, line := startHelper(t, r.lab, lender0, "lender", lenderSpec{Iface: "wan0", Listen: r.lenderAddr(0), Leases: []LeaseSpec{la},
		CertPEM: certPEM, KeyPEM: keyPEM}); line != "ready" {
		t.Fatalf("lender: %q", line)
	}
	const conns = 2
	pb, rep := r.attach(t, 0, borrowerSpec{Members: []Member{{Addr: r.lenderAddr(0), Credential: la.Credential, TLS: true}},
		Name: "rnic0", Mode: ModePacket, Conns: conns, CAPEM: ca.pem(), CRLPEM: ca.ca.CRLPEM()})
	u := newUDPEnds(t, r, rep.Addr)
	if got := u.up(t, []byte("before the revocation")); !bytes.Equal(got, []byte("before the revocation")) {
		t.Fatalf("the outside got %q", got)
	}

	if err := ca.ca.Revoke(serial); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "revmem-crl.pem")
	if err := os.WriteFile(file, ca.ca.CRLPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	rep = pb.command(t, "crl "+file)
	var ended []string
	for line := range strings.SplitSeq(rep.Log, "\n") {
		if strings.Contains(line, "ending a TLS connection: its peer's certificate is revoked") {
			ended = append(ended, line)
		}
	}
	if len(ended) != conns {
		t.Fatalf("the borrower took the list and ended %d tunnel connections, want %d:\n%s", len(ended), conns, rep.Log)
	}
	for _, line := range ended {
		if !strings.Contains(line, "peer="+r.lenderAddr(0)) || !strings.Contains(line, "serial="+serial.Text(16)) {
			t.Fatalf("the line ending a connection does not name the lender (%s) and its serial number: %s", r.lenderAddr(0), line)
		}
	}

	// The member's goroutine finds its session ended, redials, and
	// drops the lender once the handshake fails against the list.
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for rep = pb.report(t); !rep.Members[0].Dropped; rep = pb.report(t) {
		if time.Now().After(deadline) {
			t.Fatalf("the revoked lender is not dropped: %+v\n%s", rep.Members[0], pb.command(t, "log").Log)
		}
		<-tick.C
	}
	if m := rep.Members[0]; m.Up || !strings.Contains(m.Err, "revoked") {
		t.Fatalf("the dropped lender: %+v, want down, saying its certificate is revoked", m)
	}
	log := pb.command(t, "log").Log
	if !strings.Contains(log, "nic: the lender presents a revoked certificate: dropped from the bond, not redialled") ||
		!strings.Contains(log, "certificate was not accepted (revoked)") {
		t.Fatalf("the log does not say the redial found the lender's certificate revoked:\n%s", log)
	}
}
