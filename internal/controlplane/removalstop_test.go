package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// errReplicaStopped is what a test's removalCommitted hook ends a
// removal with: the replica stopped there.
var errReplicaStopped = errors.New("test: the removing replica stopped after the removal's commit")

// renewalDuringRemoval makes srv's next removal stop once it committed
// (removalCommitted), before its second revocation pass, as a replica
// killed then; before it stops, a renewal of the node's certificate
// signs, as one that signed after the removal's first pass and read the
// node before its commit leaves it: in the CA's index and the store's
// record of issues, handed out. It returns that certificate once the
// removal ran.
func renewalDuringRemoval(t *testing.T, srv *Server, node api.Node) func() tls.Certificate {
	t.Helper()
	csr, keyPEM, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	var cert *tls.Certificate
	srv.removalCommitted = func(ctx context.Context, id string) error {
		if id != node.ID {
			return nil
		}
		out, _, err := srv.signNodeCSR(ctx, node, string(csr))
		if err != nil {
			return err
		}
		c, err := tls.X509KeyPair([]byte(out.Certificate), keyPEM)
		if err != nil {
			return err
		}
		cert = &c
		return errReplicaStopped
	}
	return func() tls.Certificate {
		t.Helper()
		if cert == nil {
			t.Fatal("the removal did not reach its commit")
		}
		return *cert
	}
}

// missedRenewal is a node's removal that stopped after its commit with a
// renewal's certificate it did not revoke (renewalDuringRemoval).
type missedRenewal struct {
	node  api.Node          // the node, as it was before its removal
	first *x509.Certificate // the join's certificate, which the removal revoked
	cert  tls.Certificate   // the renewal's, which no revocation names
	leaf  *x509.Certificate // cert's leaf
	late  *big.Int          // its serial
}

// removeMissingRenewal joins n1 to srv and removes it, the removal
// stopped after its commit with a renewal's certificate it missed
// (renewalDuringRemoval).
func removeMissingRenewal(ctx context.Context, t *testing.T, srv *Server) missedRenewal {
	t.Helper()
	j, first := joinN1Cert(ctx, t, srv)
	rec, err := srv.st.Node(ctx, j.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	renewed := renewalDuringRemoval(t, srv, rec.Node)
	if _, err := srv.removeNode(ctx, j.NodeID, true); !errors.Is(err, errReplicaStopped) {
		t.Fatalf("the removal: %v, want it stopped after its commit", err)
	}
	cert := renewed()
	leaf := leafOf(t, cert)
	return missedRenewal{node: rec.Node, first: first, cert: cert, leaf: leaf, late: leaf.SerialNumber}
}

// leafOf is c's leaf certificate.
func leafOf(t *testing.T, c tls.Certificate) *x509.Certificate {
	t.Helper()
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// callAgentServing makes a call of ca's TLSLender to node's agent, here
// a server of the test's presenting cert: nil once the handshake
// succeeded.
func callAgentServing(ctx context.Context, t *testing.T, ca *pki.CA, node api.Node, cert tls.Certificate) error {
	t.Helper()
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") }))
	hs.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	hs.StartTLS()
	defer hs.Close()
	l, err := NewTLSLender(ca)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	node.AgentURL = hs.URL
	tr := l.transport(node, u, nil)
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/agent/v1/health", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// TestRemovalStoppedAfterCommitRevokedAtStart: a certificate a renewal
// signed during a node's removal, which the removal's first pass did not
// revoke, is revoked by its second pass after the commit; when the
// replica removing the node stops between the two (a hook of the test's
// ends the removal there), the next replica to start revokes it: it is on
// the store's list and the replica's, the replica's calls to an agent
// presenting it refuse the handshake, and the removal's record names it
// (the teardowns of the removed node's leases accept it). The node then
// joins again (a takeover): its new certificate is not revoked by the
// sweeps that follow. Before, nothing revoked it: the removed node kept a
// valid certificate until its expiry.
func TestRemovalStoppedAfterCommitRevokedAtStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	m := removeMissingRenewal(ctx, t, r.srv)
	late := m.late
	if !r.ca.Revoked(m.first.SerialNumber) || r.ca.Revoked(late) {
		t.Fatalf("before the restart: the join's certificate revoked %v (want true), the renewal's %v (want false)",
			r.ca.Revoked(m.first.SerialNumber), r.ca.Revoked(late))
	}

	// The replica's process ends; another opens the same database and CA
	// directory.
	st2, ca2, srv2 := reopenSQLite(ctx, t, r)
	l, err := st2.RevocationList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Revoked[late.Text(16)]; !ok {
		t.Errorf("the store's revocation list %v lacks the renewal's certificate %s", l.Revoked, late.Text(16))
	}
	if !ca2.Revoked(late) {
		t.Errorf("the restarted replica's list does not revoke the renewal's certificate %s", late.Text(16))
	}
	if err := callAgentServing(ctx, t, ca2, m.node, m.cert); err == nil {
		t.Errorf("the restarted replica's call to an agent presenting the removed node's certificate %s succeeded", late.Text(16))
	}
	if got := serialTexts(srv2.removalRevoked(ctx, m.node.ID)); !slices.Contains(got, late.Text(16)) {
		t.Errorf("the removal's record names %v, want the renewal's %s among them", got, late.Text(16))
	}

	// The node joins again: its new certificate stays valid.
	j2, again := joinN1Cert(ctx, t, srv2)
	if j2.NodeID != m.node.ID {
		t.Fatalf("joined again as %s, want %s", j2.NodeID, m.node.ID)
	}
	if err := srv2.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if ca2.Revoked(again.SerialNumber) {
		t.Errorf("the certificate of the node's new join %s was revoked", again.SerialNumber.Text(16))
	}
	if l, err := st2.RevocationList(ctx); err != nil {
		t.Fatal(err)
	} else if _, ok := l.Revoked[again.SerialNumber.Text(16)]; ok {
		t.Errorf("the store's list revokes the certificate of the node's new join %s", again.SerialNumber.Text(16))
	}
}

// TestRemovalStoppedAfterCommitRevokedBySweep: as
// TestRemovalStoppedAfterCommitRevokedAtStart, with two replicas on
// PostgreSQL, each with its copy of the CA directory: the one removing the
// node stops between the removal's commit and its second pass; the other,
// running since before the removal (its start found nothing to revoke),
// revokes the renewal's certificate at its next sweep, and refuses it.
func TestRemovalStoppedAfterCommitRevokedBySweep(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, a, b := twoPGReplicas(ctx, t)
	m := removeMissingRenewal(ctx, t, a.srv)
	late := m.late
	if err := b.srv.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.ca.Revoked(late) {
		t.Errorf("after its sweep, the other replica's list does not revoke the renewal's certificate %s", late.Text(16))
	}
	if err := callAgentServing(ctx, t, b.ca, m.node, m.cert); err == nil {
		t.Errorf("the other replica's call to an agent presenting the removed node's certificate %s succeeded", late.Text(16))
	}
	if got, err := a.st.RemovalRevoked(ctx, m.node.ID); err != nil || !slices.Contains(got.Revoked, late.Text(16)) {
		t.Errorf("the removal's record: %+v %v, want the renewal's %s among its serials", got, err, late.Text(16))
	}
}

// TestRemovedCertificateProvesNoJoin: the removed machine holding a
// certificate its removal missed (the removing replica stopped between
// the commit and the second pass, and no replica has revoked it yet)
// joins again presenting it: the join is a takeover, not a proven join of
// the node, so the certificate is revoked with the node's others, and the
// new certificate the join gets stays valid. Before, the certificate
// proved the join the node's own: the removed machine came back as the
// node and kept its missed certificate valid.
func TestRemovedCertificateProvesNoJoin(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	ca, srv := r.ca, r.srv
	m := removeMissingRenewal(ctx, t, srv)
	late := m.late
	// A replica that has not swept since answers the join (here the same
	// process: what the join reads is the store's).
	base := serveTLS(t, srv, ca)
	tc := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", Certificates: []tls.Certificate{m.cert}}
	c := api.NewClient(base, bootTok, &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: time.Minute})
	csr, _, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	j2, err := c.Join(ctx, joinN1(csr))
	if err != nil {
		t.Fatal(err)
	}
	if j2.NodeID != m.node.ID {
		t.Fatalf("joined as %s, want %s", j2.NodeID, m.node.ID)
	}
	if !ca.Revoked(late) {
		t.Errorf("the certificate the removal missed %s is not revoked after the removed machine joined again presenting it", late.Text(16))
	}
	certs, err := pki.ParseCerts([]byte(j2.Certificate))
	if err != nil || len(certs) == 0 {
		t.Fatalf("the join's certificate: %v", err)
	}
	if ca.Revoked(certs[0].SerialNumber) {
		t.Errorf("the join's new certificate %s is revoked", certs[0].SerialNumber.Text(16))
	}
}

// TestRemovalFinishedAtStartTellsTheOthers: the replica that revokes, at
// its start, the certificate a stopped removal missed tells the replicas
// listening on the broadcast channel, as the removal would have: they
// forget the removed node's cached credential, and sign their revocation
// lists from the store's, before their next hello. Before, the message it
// sent at its start named no sender (its replica bus had no identity yet
// until Run) and every other replica dropped it ("a message of another
// replica that this one does not read").
func TestRemovalFinishedAtStartTellsTheOthers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg, ra, rb := twoPGReplicas(ctx, t)
	a, stA, caA := ra.srv, ra.st, ra.ca
	// The other replica listens on the channel (its replica bus only: no
	// sweep of its own revokes the certificate first).
	b, caB := rb.srv, rb.ca
	bctx, stopBus := context.WithCancel(ctx)
	waitBus := b.runBus(bctx, rb.st)
	t.Cleanup(func() { stopBus(); waitBus() })
	pollUntil(ctx, t, "the other replica listens", b.cacheTrusted)

	m := removeMissingRenewal(ctx, t, a)
	late := m.late
	a.Close()
	// The other replica still has the removed node's credential cached
	// (the removal stopped before telling it).
	b.auth.put("h-removed", principal{role: roleNode, nodeID: m.node.ID}, time.Now().Add(time.Hour), b.auth.generation())

	// The stopped replica starts again: it revokes the certificate.
	newReplica(ctx, t, openPG(ctx, t, pg, 4), caA, nil)
	// Messages arrive in the order they were sent: once the other replica
	// has read a hello sent after the start, it has read what the start
	// sent.
	mark, _ := json.Marshal(busMsg{T: "hello", From: "test-mark", At: time.Now().UnixNano()})
	if err := stA.Broadcast(ctx, string(mark)); err != nil {
		t.Fatal(err)
	}
	pollUntil(ctx, t, "the other replica reads the mark", func() bool {
		b.bus.mu.Lock()
		defer b.bus.mu.Unlock()
		_, ok := b.bus.seen["test-mark"]
		return ok
	})
	if _, ok := b.auth.get("h-removed", time.Now()); ok {
		t.Error("the other replica still has the removed node's credential cached after the start that finished its removal")
	}
	if !caB.Revoked(late) {
		t.Errorf("the other replica's list does not revoke %s after the start that finished the removal", late.Text(16))
	}
}

// TestRemovalSweepRevokesWithinExpiryGrace: as
// TestRemovalStoppedAfterCommitRevokedBySweep, on SQLite and on
// PostgreSQL, with the sweep coming once the certificate the removal
// missed has expired by the sweeping replica's clock, by less than the
// grace the revocation list keeps expired certificates for, and another
// certificate issued meanwhile (its record forgets the records of expired
// ones): the sweep revokes it, and a peer whose clock is behind by less
// than the grace refuses it. Before, the sweep took only certificates
// unexpired by its own clock, and the other issue had forgotten the
// record: the peer accepted it.
func TestRemovalSweepRevokesWithinExpiryGrace(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			clk := clock.NewFake(time.Now())
			var srv *Server
			var ca *pki.CA
			if backend == "sqlite" {
				r := newCASQLite(ctx, t, Config{Clock: clk})
				srv, ca = r.srv, r.ca
			} else {
				ca, _ = caCopies(t)
				srv = newReplica(ctx, t, openPG(ctx, t, pgtest.DB(t), 4), ca, clk)
			}
			m := removeMissingRenewal(ctx, t, srv)
			late := m.leaf
			clk.Advance(late.NotAfter.Sub(clk.Now()) + revokedExpiryGrace/2)
			other, err := ca.Issue(pki.Request{CommonName: "n-9", Hosts: []string{"127.0.0.1"}, Usage: pki.ClientAuth, Lifetime: 48 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.recordIssued(ctx, other); err != nil {
				t.Fatal(err)
			}
			if err := srv.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			if l := revocationList(ctx, t, srv.st.(store.Revocations)); !hasSerial(l, late.SerialNumber) {
				t.Errorf("the store's list %v lacks the certificate the removal missed, %s, expired %v ago by the sweeping replica's clock",
					l.Revoked, late.SerialNumber.Text(16), revokedExpiryGrace/2)
			}
			if !ca.Revoked(late.SerialNumber) {
				t.Errorf("the sweeping replica's list does not revoke %s", late.SerialNumber.Text(16))
			}
			// The TLS lender checks validity by the real clock, behind
			// the sweeping replica's: the certificate is valid there.
			if err := callAgentServing(ctx, t, ca, m.node, m.cert); err == nil {
				t.Errorf("a call by a replica whose clock is behind to an agent presenting %s succeeded", late.SerialNumber.Text(16))
			}
		})
	}
}

// TestRemovalRevokesWithinExpiryGrace: a node's removal itself revokes
// the certificates issued to it that expired by the removing replica's
// clock less than the grace the revocation list keeps expired
// certificates for ago, as the sweep's finishRemovals does: here one
// that another replica issued (its copy of the CA directory, not the
// removing replica's, lists it). The removal counts it, the store's
// list and the removing replica's name it once the removal returned,
// and the sweep that follows finds nothing to revoke and logs no
// warning that a replica stopped during a removal. Before, the removal
// took only certificates unexpired by its clock, and a peer whose clock
// is behind accepted it until the next sweep, which revoked it under
// that warning.
func TestRemovalRevokesWithinExpiryGrace(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg := pgtest.DB(t)
	caA, caB := caCopies(t)
	clk := clock.NewFake(time.Now())
	log, logs := logtest.Logger(nil)
	a, err := New(ctx, Config{Store: openPG(ctx, t, pg, 4), Clock: clk, Logger: log, CA: caA,
		Lender: newFakeLender(), BootstrapToken: bootTok, Tokens: []Token{{Token: adminTok, Tenant: "ops", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b := newReplica(ctx, t, openPG(ctx, t, pg, 4), caB, nil)
	j, cert := joinN1Cert(ctx, t, b)
	clk.Advance(cert.NotAfter.Sub(clk.Now()) + revokedExpiryGrace/2)
	rm, err := a.removeNode(ctx, j.NodeID, true)
	if err != nil {
		t.Fatal(err)
	}
	if rm.Revoked != 1 {
		t.Errorf("the removal revoked %d certificate(s), want 1: the join's, expired %v ago by its clock", rm.Revoked, revokedExpiryGrace/2)
	}
	if l := revocationList(ctx, t, a.st.(store.Revocations)); !hasSerial(l, cert.SerialNumber) {
		t.Errorf("after the removal, the store's list %v lacks the join's certificate %s", l.Revoked, cert.SerialNumber.Text(16))
	}
	if !caA.Revoked(cert.SerialNumber) {
		t.Errorf("after the removal, the removing replica's list does not revoke %s", cert.SerialNumber.Text(16))
	}
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); strings.Contains(out, "did not revoke") {
		t.Errorf("the sweep after a removal that completed says a replica did not revoke certificates:\n%s", out)
	}
}

// pgReplica is a replica on PostgreSQL: its server, its store and its
// copy of the CA directory.
type pgReplica struct {
	srv *Server
	st  *postgres.Store
	ca  *pki.CA
}

// twoPGReplicas starts two replicas (newReplica) on one fresh PostgreSQL
// database, whose URL it returns, each with its own store and its own
// copy of the CA directory.
func twoPGReplicas(ctx context.Context, t *testing.T) (pg string, a, b pgReplica) {
	t.Helper()
	pg = pgtest.DB(t)
	caA, caB := caCopies(t)
	stA := openPG(ctx, t, pg, 4)
	a = pgReplica{srv: newReplica(ctx, t, stA, caA, nil), st: stA, ca: caA}
	stB := openPG(ctx, t, pg, 4)
	b = pgReplica{srv: newReplica(ctx, t, stB, caB, nil), st: stB, ca: caB}
	return pg, a, b
}

// newReplica starts a control plane on st with ca, timed by clk (nil:
// the real clock), the admin's token its only tenant's, stopped when the
// test ends (it does not Run: no sweeps of its own, no replica bus).
func newReplica(ctx context.Context, t *testing.T, st store.Store, ca *pki.CA, clk clock.Clock) *Server {
	t.Helper()
	s, err := New(ctx, Config{Store: st, Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CA: ca,
		Lender: newFakeLender(), BootstrapToken: bootTok, Tokens: []Token{{Token: adminTok, Tenant: "ops", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// hasSerial reports whether l revokes serial.
func hasSerial(l store.RevocationList, serial *big.Int) bool {
	_, ok := l.Revoked[serial.Text(16)]
	return ok
}
