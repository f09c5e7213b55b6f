package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestReplicaCopiesShareRevocations: two replicas on one PostgreSQL
// database, each with its own copy of the cluster CA's directory (as on
// two hosts). A node joins through the first and renews its certificate
// there (both certificates are in the first copy's issued.txt only); an
// admin removes the node through the second. Once the removal returns,
// both replicas refuse both certificates, and an agent heartbeating to
// either is handed the same revocation list: one number, naming both
// (so one holding either replica's list takes nothing older or other
// from the other), and naming too what the second copy's own list had
// revoked, under a higher number, before the replicas started. Before the
// store kept the revocation list, the second replica's removal revoked
// nothing (its issued.txt lists none of the node's certificates), and the
// replicas' copies numbered their lists independently.
func TestReplicaCopiesShareRevocations(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.DB(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	caA, caB := caCopies(t)
	// The second copy's own list revokes a certificate the first's does
	// not, under a higher number (as written before the store kept the
	// list, or by `rialto ca`): both replicas' lists name it too.
	earlier := big.NewInt(0x5eed)
	for _, n := range []*big.Int{earlier, big.NewInt(0x5eee)} {
		if err := caB.Revoke(n); err != nil {
			t.Fatal(err)
		}
	}
	replica := func(ca *pki.CA) (*Server, string) {
		s := runServer(ctx, t, Config{Store: openPG(ctx, t, url, 8), Logger: log, CA: ca, Lender: newFakeLender(), BootstrapToken: bootTok,
			Tokens:            []Token{{Token: adminTok, Tenant: "admin", Admin: true}},
			HeartbeatInterval: 100 * time.Millisecond, SuspectAfter: 10 * time.Minute, DownAfter: 20 * time.Minute})
		return s, serveTLS(t, s, ca)
	}
	a, aURL := replica(caA)
	b, bURL := replica(caB)
	awaitReplicasMeet(ctx, t, a, b)

	client := func(base, token string, cert *tls.Certificate) *api.Client {
		tc := &tls.Config{RootCAs: caA.Pool(), ServerName: "127.0.0.1"}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		return api.NewClient(base, token, &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: time.Minute})
	}
	type node struct {
		id, cred string
		cert     tls.Certificate
	}
	join := func(base, name string) node {
		t.Helper()
		csr, keyPEM, err := pki.NewCSR("", []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		j, err := client(base, bootTok, nil).Join(ctx, api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "https://127.0.0.1:1",
			Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30},
			Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"}},
			CSR:         string(csr)})
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair([]byte(j.Certificate), keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return node{j.NodeID, j.Credential, cert}
	}
	n1 := join(aURL, "n1")
	// Renewed through the first replica too.
	csr, _, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := client(aURL, n1.cred, &n1.cert).NodeCertificate(ctx, n1.id, api.NodeCertificateRequest{CSR: string(csr)})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCerts([]byte(renewed.Certificate))
	if err != nil || len(certs) == 0 {
		t.Fatalf("the renewed certificate: %v", err)
	}
	issued := []*x509.Certificate{n1.cert.Leaf, certs[0]}
	// Another node, to heartbeat: its agent is handed the list.
	n2 := join(bURL, "n2")

	r, err := client(bURL, adminTok, nil).RemoveNode(ctx, n1.id, true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Revoked != len(issued) {
		t.Errorf("the removal through the other replica revoked %d certificate(s), want %d", r.Revoked, len(issued))
	}
	// At once, on both replicas: no polling.
	for name, ca := range map[string]*pki.CA{"the issuing replica": caA, "the removing replica": caB} {
		for i, c := range issued {
			if err := ca.Verify(c, pki.ClientAuth); !errors.Is(err, pki.ErrRevoked) {
				t.Errorf("%s, the removed node's certificate %d: %v, want revoked", name, i, err)
			}
		}
	}
	roots, err := pki.ParseCerts(caA.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	var numbers []*big.Int
	for _, base := range []string{aURL, bURL} {
		hb, err := client(base, n2.cred, &n2.cert).Heartbeat(ctx, n2.id, api.Heartbeat{Health: "ok"})
		if err != nil {
			t.Fatal(err)
		}
		crl, err := pki.ParseCRL([]byte(hb.CRL), roots)
		if err != nil {
			t.Fatalf("the list %s hands an agent: %v", base, err)
		}
		named := map[string]bool{}
		for _, e := range crl.RevokedCertificateEntries {
			named[e.SerialNumber.Text(16)] = true
		}
		for i, c := range issued {
			if !named[c.SerialNumber.Text(16)] {
				t.Errorf("the list %s hands an agent (number %v) does not name the removed node's certificate %d", base, crl.Number, i)
			}
		}
		if !named[earlier.Text(16)] {
			t.Errorf("the list %s hands an agent (number %v) does not name the certificate the second copy revoked before", base, crl.Number)
		}
		numbers = append(numbers, crl.Number)
	}
	if numbers[0].Cmp(numbers[1]) != 0 {
		t.Errorf("the replicas hand agents lists numbered %v and %v", numbers[0], numbers[1])
	}
	// An agent holding one replica's list is handed nothing by the other.
	for _, base := range []string{aURL, bURL} {
		hb, err := client(base, n2.cred, &n2.cert).Heartbeat(ctx, n2.id, api.Heartbeat{Health: "ok", CRLNumber: numbers[0].Int64()})
		if err != nil {
			t.Fatal(err)
		}
		if hb.CRL != "" {
			t.Errorf("%s hands an agent holding list %v another list", base, numbers[0])
		}
	}
}

// TestStoreFailingKeepsLocalRevocations: a replica whose store answers
// errors for the revocation list (here its tables gone) still re-reads
// its CA directory's ca-crl.pem at each sweep, so that a revocation by
// another process sharing the directory (`rialto ca`, pki.CA.Revoke)
// takes effect there as it did before the store kept the list. Before,
// syncCRL returned at the store's error without reading the file, and
// the replica accepted the revoked certificate until the store answered
// again.
func TestStoreFailingKeepsLocalRevocations(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url, dir, ca, s, iss := newCAPG(ctx, t)
	if _, err := s.syncCRL(ctx); err != nil {
		t.Fatalf("signing the list from the store: %v", err)
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `ALTER TABLE crl_number RENAME TO crl_number_gone`); err != nil {
		t.Fatal(err)
	}
	// Another process sharing the directory revokes the certificate.
	other, err := pki.Open(dir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Revoke(iss.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if _, err := s.syncCRL(ctx); err == nil {
		t.Fatal("signing the list from a store without its tables: no error")
	}
	if err := ca.Verify(iss.Cert, pki.ClientAuth); !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("the certificate revoked in the CA directory while the store failed: %v, want revoked", err)
	}
	// The store back: the directory's revocation goes into it.
	if _, err := c.Exec(ctx, `ALTER TABLE crl_number_gone RENAME TO crl_number`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.syncCRL(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := s.st.(store.Revocations).RevocationList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Revoked[iss.Cert.SerialNumber.Text(16)]; !ok || l.Number != ca.CRLNumber().Int64() {
		t.Fatalf("the store's list after it came back: %+v, want the serial under number %v", l, ca.CRLNumber())
	}
}

// TestRemovalStoreRevokedSyncFailing: a removal that finds the node's
// certificates already revoked in the store (an earlier attempt recorded
// them there, then failed) while this replica cannot sign its list from
// the store's (here its CA directory's list has a number the store cannot
// hold) still revokes them in its CA directory, reports them, and records
// them with the removal (for the replicas that call the removed node's
// agent later). Before, it took only the serials new to the store: it
// revoked none locally, so the replica accepted the node's certificate,
// and reported and recorded none.
func TestRemovalStoreRevokedSyncFailing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	ca, st, srv := r.ca, r.st, r.srv
	j, cert := joinN1Cert(ctx, t, srv)
	// An earlier attempt recorded the revocation in the store.
	if got, _, err := st.Revoke(ctx, nil, j.NodeID, time.Now(), time.Now(), 0); err != nil || len(got) != 1 {
		t.Fatalf("revoking in the store: %v %v", got, err)
	}
	// The directory's list numbered beyond what the store holds: every
	// sync from the store fails.
	huge := new(big.Int).Lsh(big.NewInt(1), 63)
	if _, err := ca.Adopt(pki.SharedList{Number: huge, Revoked: map[string]time.Time{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.syncCRL(ctx); err == nil {
		t.Fatal("signing the list from the store: no error")
	}
	if err := ca.Verify(cert, pki.ClientAuth); err != nil {
		t.Fatalf("before the removal: %v", err)
	}
	out, err := srv.removeNode(ctx, j.NodeID, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Verify(cert, pki.ClientAuth); !errors.Is(err, pki.ErrRevoked) {
		t.Errorf("the removed node's certificate on this replica: %v, want revoked", err)
	}
	if out.Revoked != 1 {
		t.Errorf("the removal reports %d certificate(s) revoked, want 1", out.Revoked)
	}
	if got, err := st.RemovalRevoked(ctx, j.NodeID); err != nil || !slices.Equal(got.Revoked, []string{cert.SerialNumber.Text(16)}) {
		t.Errorf("recorded with the removal: %v %v, want %s", got, err, cert.SerialNumber.Text(16))
	}
}

// TestConcurrentCRLSyncsShared: callers of syncCRL arriving while one
// sync runs (as every request with a client certificate does on a replica
// that does not trust its cache) share the next one, which starts after
// they arrived, instead of each running its own behind the other: here
// eight callers arrive while the running sync waits for the CA
// directory's lock (held by the test), and at most two syncs run. Before,
// each ran a full sync in turn: eight.
func TestConcurrentCRLSyncsShared(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	srv, dir := r.srv, r.ca.Dir()
	if _, err := srv.syncCRL(ctx); err != nil {
		t.Fatal(err)
	}
	// Another process holds the CA directory: the sync that runs waits.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var arrived sync.WaitGroup
	arrived.Add(n)
	srv.crl.mu.Lock()
	srv.crl.joined = arrived.Done
	runs := srv.crl.runs
	srv.crl.mu.Unlock()
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := srv.syncCRL(ctx)
			errs <- err
		}()
	}
	arrived.Wait()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	srv.crl.mu.Lock()
	runs = srv.crl.runs - runs
	srv.crl.mu.Unlock()
	if runs > 2 {
		t.Errorf("%d callers arriving while a sync ran ran %d syncs, want at most 2", n, runs)
	}
}

// TestExpiredRevocationsDropped: a revoked certificate that has expired
// leaves the store's revocation list (an expired certificate is refused
// anyway: every check of a peer verifies its validity period), at a
// sweep, under a higher number, and the replica's ca-crl.pem with it; it
// is not recorded again from the replica's copy of the list that still
// named it. A serial of no certificate issued stays (until the CA
// certificate's expiry: TestLocalRevocationsExpire). Before, the list
// only grew.
func TestExpiredRevocationsDropped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clk := clock.NewFake(time.Now())
	r := newCASQLite(ctx, t, Config{Clock: clk})
	ca, st, srv := r.ca, r.st, r.srv
	j, cert := joinN1Cert(ctx, t, srv)
	serial := cert.SerialNumber
	if _, err := srv.removeNode(ctx, j.NodeID, true); err != nil {
		t.Fatal(err)
	}
	unknown := big.NewInt(0x5eed)
	if _, err := srv.revokeCerts(ctx, "", []*big.Int{unknown}); err != nil {
		t.Fatal(err)
	}
	list := func() store.RevocationList { return revocationList(ctx, t, st) }
	before := list()
	if _, ok := before.Revoked[serial.Text(16)]; !ok || !ca.Revoked(serial) {
		t.Fatalf("the removed node's certificate is not revoked: %+v", before)
	}
	// Past the certificate's expiry.
	clk.Advance(cert.NotAfter.Sub(clk.Now()) + 2*time.Hour)
	for i := range 2 {
		if err := srv.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		l := list()
		if _, ok := l.Revoked[serial.Text(16)]; ok {
			t.Fatalf("sweep %d: the expired certificate is still on the list (number %d)", i, l.Number)
		}
		if _, ok := l.Revoked[unknown.Text(16)]; !ok {
			t.Fatalf("sweep %d: the serial of no certificate issued left the list", i)
		}
		if l.Number != before.Number+1 {
			t.Fatalf("sweep %d: number %d, want %d", i, l.Number, before.Number+1)
		}
		if ca.Revoked(serial) || !ca.Revoked(unknown) || ca.CRLNumber().Int64() != l.Number {
			t.Fatalf("sweep %d: ca-crl.pem (number %v) names the expired certificate: %v, the other: %v", i, ca.CRLNumber(), ca.Revoked(serial), ca.Revoked(unknown))
		}
	}
}

// TestLocalRevocationsExpire: serials revoked in the CA directory only
// (pki.CA.Revoke, RevokeIssuedTo: another process sharing it, a replica
// whose store failed, a version before the store kept the list) and a
// node's certificates only the directory's issued.txt lists (issued
// before the store recorded issues) go into the store's list with their
// certificates' expiry from issued.txt, and leave it once expired, as
// those whose issue the store recorded do; a serial issued.txt does not
// list goes in with the latest expiry of the CA certificates, which
// bounds every certificate the CA signed, and leaves the list after it.
// Before, all of them went in without an expiry and stayed for ever.
func TestLocalRevocationsExpire(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clk := clock.NewFake(time.Now())
	r := newCASQLite(ctx, t, Config{Clock: clk})
	ca, st, srv := r.ca, r.st, r.srv
	issue := func(cn string) *x509.Certificate { return issueHour(t, ca, cn) }
	byRevoke, byHolder, byRemoval := issue("n-7"), issue("n-8"), issue("n-9")
	if err := ca.Revoke(byRevoke.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.RevokeIssuedTo("n-8"); err != nil {
		t.Fatal(err)
	}
	unknown := big.NewInt(0x5eed)
	if err := ca.Revoke(unknown); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.syncCRL(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.revokeCerts(ctx, "n-9", nil); err != nil {
		t.Fatal(err)
	}
	local := []*big.Int{byRevoke.SerialNumber, byHolder.SerialNumber, byRemoval.SerialNumber}
	list := func() store.RevocationList { return revocationList(ctx, t, st) }
	if l := list(); len(l.Revoked) != len(local)+1 {
		t.Fatalf("the store's list: %v, want the %d serials revoked", l.Revoked, len(local)+1)
	}
	expireInTurn(ctx, t, r, clk, byRemoval.NotAfter, local, unknown, "revoked in the CA directory")
}

// TestDirectoryListAheadRecordedAbove: a replica whose CA directory's
// list is ahead of the store's (a higher number: written before the
// store kept the list) and revokes what the store's lacks records that
// in the store under a number above its own list's at once: the store's
// list, which holds a revocation the directory's lacks, never takes the
// directory's list's number (another replica would sign it so, and an
// agent holding the directory's list would never take it). Before, the
// store's list took the revocation under its number raised by one, here
// the directory's, and was raised above it only in the next round.
func TestDirectoryListAheadRecordedAbove(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	ca, st, srv := r.ca, r.st, r.srv
	local := big.NewInt(0x5eed)
	if err := ca.Revoke(local); err != nil {
		t.Fatal(err)
	}
	dirNum := ca.CRLNumber().Int64()
	// Another replica's revocation, in the store's list numbered one
	// below the directory's.
	if err := st.RaiseRevocationNumber(ctx, dirNum-2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Revoke(ctx, []store.RevokedCert{{Serial: "abc"}}, "", time.Time{}, time.Now(), 0); err != nil {
		t.Fatal(err)
	}
	if l, err := st.RevocationList(ctx); err != nil || l.Number != dirNum-1 {
		t.Fatalf("the store's list: %+v %v, want number %d", l, err, dirNum-1)
	}
	// Every number the store's list takes, as it commits.
	db, err := sql.Open("sqlite", "file:"+r.path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{`CREATE TABLE test_crl_numbers (number INTEGER NOT NULL)`,
		`CREATE TRIGGER test_crl_numbers AFTER UPDATE OF number ON crl_number BEGIN INSERT INTO test_crl_numbers VALUES (NEW.number); END`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := srv.syncCRL(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, `SELECT number FROM test_crl_numbers`)
	if err != nil {
		t.Fatal(err)
	}
	var numbers []int64
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		numbers = append(numbers, n)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(numbers, dirNum) {
		t.Errorf("the store's list took the numbers %v: %d, the CA directory's list's, with a revocation that list lacks", numbers, dirNum)
	}
	l, err := st.RevocationList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Revoked[local.Text(16)]; !ok || l.Number <= dirNum || ca.CRLNumber().Int64() != l.Number || !ca.Revoked(big.NewInt(0xabc)) {
		t.Errorf("after the sync: the store's list %+v, the directory's numbered %v; want both, one number above %d", l, ca.CRLNumber(), dirNum)
	}
}

// TestUndatedRevocationsExpire: serials on the store's list without an
// expiry (revoked_certs.not_after NULL: revoked by a version before the
// store recorded expiries, their issue not recorded then) are given one
// at a sync, by the rule a revocation now follows: the one the store
// recorded with the certificate's issue, else the CA directory's
// issued.txt's, else the latest expiry of the CA certificates; and leave
// the list once expired, as the others do. Before, they stayed on the
// list for ever.
func TestUndatedRevocationsExpire(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clk := clock.NewFake(time.Now())
	r := newCASQLite(ctx, t, Config{Clock: clk})
	ca, st, srv := r.ca, r.st, r.srv
	issue := func(cn string) *x509.Certificate { return issueHour(t, ca, cn) }
	recorded, local := issue("n-5"), issue("n-6")
	if err := st.RecordIssued(ctx, recorded.SerialNumber.Text(16), "n-5", recorded.NotAfter, clk.Now()); err != nil {
		t.Fatal(err)
	}
	unknown := big.NewInt(0x5eed)
	// Revoked as a version before migration 18 did: no expiry.
	db, err := sql.Open("sqlite", "file:"+r.path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, n := range []*big.Int{recorded.SerialNumber, local.SerialNumber, unknown} {
		if _, err := db.ExecContext(ctx, `INSERT INTO revoked_certs (serial, revoked_at) VALUES (?, ?)`, n.Text(16), clk.Now().Unix()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `UPDATE crl_number SET number = number + 1`); err != nil {
		t.Fatal(err)
	}
	list := func() store.RevocationList { return revocationList(ctx, t, st) }
	if l := list(); len(l.NoExpiry) != 3 {
		t.Fatalf("of unknown expiry before the sync: %v, want the 3 revoked", l.NoExpiry)
	}
	if _, err := srv.syncCRL(ctx); err != nil {
		t.Fatal(err)
	}
	before := list()
	if len(before.NoExpiry) != 0 || len(before.Revoked) != 3 {
		t.Fatalf("after the sync: %v on the list, %v of unknown expiry; want the 3, none", before.Revoked, before.NoExpiry)
	}
	for _, n := range []*big.Int{recorded.SerialNumber, local.SerialNumber, unknown} {
		if !ca.Revoked(n) {
			t.Fatalf("%s is not revoked in the CA directory after the sync", n.Text(16))
		}
	}
	l := expireInTurn(ctx, t, r, clk, local.NotAfter, []*big.Int{recorded.SerialNumber, local.SerialNumber}, unknown, "revoked without an expiry")
	if l.Number <= before.Number {
		t.Errorf("the list's number %d after the expiry, want above %d", l.Number, before.Number)
	}
}

// TestRotationWhileRunningKeepsRevocations: `rialto ca rotate` on the CA
// directory of running replicas (step 1 of "Rotating the CA", before
// their restart) re-signs ca-crl.pem with the new key. A replica sharing
// the directory still signs its list from the store's, so a node removed
// through another replica meanwhile has its certificate refused there.
// Before, each sweep failed ("ca-crl.pem is not signed by the CA", the
// error twice in one log line) and the replica accepted the certificate
// until it restarted. The list it hands out stays signed with its own
// key (agents may not hold the new CA yet). A directory that holds
// another CA is one error, saying to restart.
func TestRotationWhileRunningKeepsRevocations(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, dir, ca, s, iss := newCAPG(ctx, t)
	if _, err := s.syncCRL(ctx); err != nil {
		t.Fatal(err)
	}
	rot, err := pki.Load(dir, pki.Options{}) // rialto ca rotate
	if err != nil {
		t.Fatal(err)
	}
	oldSigner := ca.Certificate()
	if err := rot.Rotate(); err != nil {
		t.Fatal(err)
	}
	// What the replica hands agents, which may hold only the old
	// ca-cert.pem until step 2, is signed with the key it signs with.
	if _, err := s.syncCRL(ctx); err != nil {
		t.Fatalf("re-reading the list a rotation signed: %v", err)
	}
	if _, err := pki.ParseCRL(ca.CRLPEM(), []*x509.Certificate{oldSigner}); err != nil {
		t.Fatalf("the list handed out after a rotation: %v", err)
	}
	// Another replica removes the node: the store records its certificate.
	if _, _, err := s.st.(store.Revocations).Revoke(ctx, []store.RevokedCert{{Serial: iss.Cert.SerialNumber.Text(16), NotAfter: iss.Cert.NotAfter}}, "", time.Time{}, time.Now(), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.syncCRL(ctx); err != nil {
		t.Fatalf("signing the list from the store after a rotation: %v", err)
	}
	if err := ca.Verify(iss.Cert, pki.ClientAuth); !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("a certificate the store revoked after a rotation: %v, want revoked", err)
	}
	// The directory replaced by another CA's.
	other := t.TempDir()
	if _, err := pki.Open(other, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{pki.CACertFile, pki.CAKeyFile, pki.CRLFile} {
		b, err := os.ReadFile(filepath.Join(other, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err = s.syncCRL(ctx)
	if err == nil || strings.Count(err.Error(), "restart the process") != 1 {
		t.Fatalf("the list of another CA: %v, want one error saying to restart", err)
	}
	if err := ca.Verify(iss.Cert, pki.ClientAuth); !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("the list held dropped: %v", err)
	}
}

// newCAPG starts a control plane on a PostgreSQL database of its own
// (url) with a CA directory (dir) of its own, closed when the test ends,
// and issues a client certificate to node n-1.
func newCAPG(ctx context.Context, t *testing.T) (url, dir string, ca *pki.CA, s *Server, iss *pki.Issued) {
	t.Helper()
	url = pgtest.DB(t)
	dir = filepath.Join(t.TempDir(), "tls")
	ca, err := pki.Open(dir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err = New(ctx, Config{Store: openPG(ctx, t, url, 4), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CA: ca,
		Lender: newFakeLender(), BootstrapToken: bootTok, Tokens: []Token{{Token: adminTok, Tenant: "admin", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	iss, err = ca.Issue(pki.Request{CommonName: "n-1", Hosts: []string{"127.0.0.1"}, Usage: pki.ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return url, dir, ca, s, iss
}

// issueHour issues an hour's client certificate for cn from ca.
func issueHour(t *testing.T, ca *pki.CA, cn string) *x509.Certificate {
	t.Helper()
	iss, err := ca.Issue(pki.Request{CommonName: cn, Hosts: []string{"127.0.0.1"}, Usage: pki.ClientAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return iss.Cert
}

// revocationList is st's revocation list.
func revocationList(ctx context.Context, t *testing.T, st store.Revocations) store.RevocationList {
	t.Helper()
	l, err := st.RevocationList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// expireInTurn moves clk past notAfter (the revoked certificates'
// expiry) and sweeps: the serials of gone (what, for the errors) have left
// the store's list and the CA directory's, unknown (a serial issued.txt
// does not list) has not; it returns the list then. It then moves clk past
// the CA certificate's expiry and sweeps: the list is empty.
func expireInTurn(ctx context.Context, t *testing.T, r caSQLite, clk *clock.Fake, notAfter time.Time, gone []*big.Int, unknown *big.Int, what string) store.RevocationList {
	t.Helper()
	clk.Advance(notAfter.Sub(clk.Now()) + 2*time.Hour)
	if err := r.srv.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	l := revocationList(ctx, t, r.st)
	for i, n := range gone {
		if _, ok := l.Revoked[n.Text(16)]; ok || r.ca.Revoked(n) {
			t.Errorf("certificate %d, %s, is still on the list (number %d) after its expiry", i, what, l.Number)
		}
	}
	if _, ok := l.Revoked[unknown.Text(16)]; !ok || !r.ca.Revoked(unknown) {
		t.Fatal("the serial issued.txt does not list left the list before the CA certificate expired")
	}
	clk.Advance(r.ca.Certificate().NotAfter.Sub(clk.Now()) + 2*time.Hour)
	if err := r.srv.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if after := revocationList(ctx, t, r.st); len(after.Revoked) != 0 || r.ca.Revoked(unknown) {
		t.Errorf("after the CA certificate's expiry: %v on the list, want none", after.Revoked)
	}
	return l
}
