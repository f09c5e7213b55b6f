package controlplane

import (
	"context"
	"crypto/tls"
	"database/sql"
	"math/big"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestLateRemovalRevokedRecorded: the serials a removal's second
// revocation pass revokes after its commit (a renewal signed during the
// removal) are written with the removal's (AddRemovalRevoked); when the
// database refuses that write (a trigger of the test's own raises an error
// on it, and on no other write), the serials are not lost to the replicas
// that call the removed node's agent later (a failed move's destination
// there): the removing replica accepts them at once (it holds them), and
// records them once the database takes the write again, at its next sweep.
// Before, the failure was only logged: the store never had the serials,
// and a teardown or abort on another replica, or on this one after a
// restart, refused the agent presenting that certificate. (The renewal's
// race with the removal itself is TestRenewalDuringRemovalIsRevoked's; since
// the store keeps the revocation list, its first pass waits for the
// database as the commit does, so this test calls the second pass's
// recording itself.)
func TestLateRemovalRevokedRecorded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	ca, st, path, srv := r.ca, r.st, r.path, r.srv
	anon := api.NewClient(serveTLS(t, srv, ca), "", &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}}})
	csr, _, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	j, err := anon.WithToken(bootTok).Join(ctx, joinN1(csr))
	if err != nil {
		t.Fatal(err)
	}
	joined, err := pki.ParseCerts([]byte(j.Certificate))
	if err != nil || len(joined) == 0 {
		t.Fatalf("the join's certificate: %v", err)
	}

	// Removed (forced: its agent may still run): the join's certificate
	// is revoked and recorded with the removal.
	rm, err := anon.WithToken(adminTok).RemoveNode(ctx, j.NodeID, true)
	if err != nil {
		t.Fatal(err)
	}
	first := joined[0].SerialNumber.Text(16)
	if rm.Revoked != 1 || !ca.Revoked(joined[0].SerialNumber) {
		t.Fatalf("the removal revoked %d certificate(s), the join's revoked: %v; want 1, the join's", rm.Revoked, ca.Revoked(joined[0].SerialNumber))
	}
	recorded := func() []string {
		t.Helper()
		got, err := st.RemovalRevoked(ctx, j.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Revoked
	}
	if got := recorded(); !slices.Equal(got, []string{first}) {
		t.Fatalf("recorded with the removal: %v; want the join's certificate's serial %s", got, first)
	}

	// A serial of the second pass that the database refuses to record.
	late := new(big.Int).Lsh(big.NewInt(0x5eed), 100).Text(16)
	db := refuseSerial(ctx, t, path, late)
	rec, err := st.RemovalRevoked(ctx, j.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	srv.recordLateRevoked(ctx, st, j.NodeID, rec.Gen, []string{late})
	if got := recorded(); slices.Contains(got, late) {
		t.Fatalf("recorded with the removal: %v; the database refused the late serial %s", got, late)
	}
	// Meanwhile this replica's calls to the node's agent accept it.
	if got := serialTexts(srv.removalRevoked(ctx, j.NodeID)); !slices.Contains(got, late) || !slices.Contains(got, first) {
		t.Errorf("this replica accepts %v of the removed node's certificates, want the join's %s and the late %s", got, first, late)
	}

	// The database takes the write again: the next sweep records it.
	if _, err := db.ExecContext(ctx, `DROP TRIGGER test_refuse_late_serial`); err != nil {
		t.Fatal(err)
	}
	if err := srv.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := recorded(); !slices.Contains(got, late) || !slices.Contains(got, first) {
		t.Errorf("recorded after the sweep: %v; want the join's certificate's serial and the late %s", got, late)
	}
}

// TestLateRevokedSurviveRestart: the serial of a certificate signed
// during a node's removal, which the removal's second pass revoked after
// its commit and the database refused to record with the removal (the
// replica holding it then), survives a restart of that replica: the
// control plane started anew on the same database and CA directory finds
// it again (the store has it revoked and recorded as issued to the
// removed node), accepts it in its calls to the node's agent at once, and
// records it with the removal at its next sweep once the database takes
// the write. Before, the restart forgot it: the store never had it with
// the removal, and every replica's calls to the node's agent refused
// that certificate.
func TestLateRevokedSurviveRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	ca, st, path, srv := r.ca, r.st, r.path, r.srv
	csr, _, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	j, err := srv.joinAs(ctx, joinN1(csr), "")
	if err != nil {
		t.Fatal(err)
	}
	id := j.NodeID
	if _, err := srv.removeNode(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	rec, err := st.RemovalRevoked(ctx, id)
	if err != nil || len(rec.Revoked) != 1 {
		t.Fatalf("recorded with the removal: %+v %v, want the join's certificate", rec, err)
	}
	first := rec.Revoked[0]

	// A certificate a renewal signed during the removal, in the CA's
	// index and the store's record of issues, as signNodeCSR leaves it;
	// the second pass revokes it, and the database refuses to record it
	// with the removal.
	iss, err := ca.Issue(pki.Request{CommonName: id, Hosts: []string{"127.0.0.1"}, Usage: pki.ClientAuth | pki.ServerAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.recordIssued(ctx, iss); err != nil {
		t.Fatal(err)
	}
	late := iss.Cert.SerialNumber.Text(16)
	db := refuseSerial(ctx, t, path, late)
	again, err := srv.revokeCerts(ctx, id, nil)
	if err != nil || !slices.Contains(serialTexts(again), late) {
		t.Fatalf("the second pass revoked %v %v, want the renewal's %s", serialTexts(again), err, late)
	}
	srv.recordLateRevoked(ctx, st, id, rec.Gen, []string{late})
	if got, err := st.RemovalRevoked(ctx, id); err != nil || slices.Contains(got.Revoked, late) {
		t.Fatalf("recorded with the removal: %+v %v; the database refused the late serial %s", got, err, late)
	}
	if got := serialTexts(srv.removalRevoked(ctx, id)); !slices.Contains(got, late) {
		t.Fatalf("the removing replica accepts %v, want the late %s among them", got, late)
	}

	// The replica restarts: its process (and what it held) ends; another
	// opens the same database and CA directory.
	st2, _, srv2 := reopenSQLite(ctx, t, r)
	if got := serialTexts(srv2.removalRevoked(ctx, id)); !slices.Contains(got, late) || !slices.Contains(got, first) {
		t.Errorf("after the restart the replica accepts %v of the removed node's certificates, want the join's %s and the late %s", got, first, late)
	}
	// Still refused: the sweep's write fails, and it is still held.
	if err := srv2.Sweep(ctx); err == nil {
		t.Error("the sweep recorded the late serial the database refuses")
	}
	if got := serialTexts(srv2.removalRevoked(ctx, id)); !slices.Contains(got, late) {
		t.Errorf("after a failed sweep the replica accepts %v, want the late %s among them", got, late)
	}
	// The database takes the write again: the next sweep records it.
	if _, err := db.ExecContext(ctx, `DROP TRIGGER test_refuse_late_serial`); err != nil {
		t.Fatal(err)
	}
	if err := srv2.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := st2.RemovalRevoked(ctx, id); err != nil || !slices.Contains(got.Revoked, late) || !slices.Contains(got.Revoked, first) {
		t.Errorf("recorded after the sweep: %+v %v; want the join's certificate's serial and the late %s", got, err, late)
	}
}

// TestLateRevokedNotAddedToLaterRemoval: serials a removal revoked after
// its commit, held by this replica because the database refused them,
// belong to that removal only. Here the removal recorded none at its
// commit; the node then joins again and is removed again (elsewhere,
// with serials of its own): this replica's next sweep must not add the
// first removal's serials to the second's record, nor its calls to the
// node's agent accept them. Before, a removal that recorded none took
// whatever the store held for the node as its own.
func TestLateRevokedNotAddedToLaterRemoval(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newCASQLite(ctx, t, Config{})
	st, path, srv := r.st, r.path, r.srv
	join := func() string {
		t.Helper()
		csr, _, err := pki.NewCSR("", []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		j, err := srv.joinAs(ctx, joinN1(csr), "")
		if err != nil {
			t.Fatal(err)
		}
		return j.NodeID
	}
	id := join()
	// The first removal records no serial at its commit; the one its
	// second pass revoked the database refuses.
	_, gen, err := st.RemoveNode(ctx, id, nil, api.Event{At: time.Now(), Type: "node.removed", Subject: id})
	if err != nil {
		t.Fatal(err)
	}
	late := new(big.Int).Lsh(big.NewInt(0x1a7e), 100).Text(16)
	db := refuseSerial(ctx, t, path, late)
	srv.recordLateRevoked(ctx, st, id, gen, []string{late})
	if _, err := db.ExecContext(ctx, `DROP TRIGGER test_refuse_late_serial`); err != nil {
		t.Fatal(err)
	}
	// The node joins again (taking the removed node over), and is
	// removed again, elsewhere.
	if again := join(); again != id {
		t.Fatalf("joined again as %s, want %s", again, id)
	}
	// The second removal revokes the node's certificates before its
	// commit, as removeNode does (a sweep would revoke a removed node's
	// certificates no revocation names: finishRemovals), and records
	// them with one more serial of its own.
	revoked, err := srv.revokeCerts(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	second := append(serialTexts(revoked), new(big.Int).Lsh(big.NewInt(0x5ec0), 100).Text(16))
	if _, _, err := st.RemoveNode(ctx, id, second, api.Event{At: time.Now(), Type: "node.removed", Subject: id}); err != nil {
		t.Fatal(err)
	}
	if got := serialTexts(srv.removalRevoked(ctx, id)); !slices.Equal(got, second) {
		t.Errorf("this replica accepts %v of the node's certificates, want the second removal's %v only", got, second)
	}
	if err := srv.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := st.RemovalRevoked(ctx, id); err != nil || !slices.Equal(got.Revoked, second) {
		t.Errorf("recorded with the second removal: %v %v, want %v only", got, err, second)
	}
}

// refuseSerial makes the SQLite database at path refuse any write of a
// removal's serials that names serial (a trigger the test drops with
// DROP TRIGGER test_refuse_late_serial on the database returned, which
// closes when the test ends): a real write failure, of that write only.
func refuseSerial(ctx context.Context, t *testing.T, path, serial string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.ExecContext(ctx, `CREATE TRIGGER test_refuse_late_serial BEFORE UPDATE OF removal_revoked ON nodes
		WHEN instr(NEW.removal_revoked, '`+serial+`') > 0 BEGIN SELECT RAISE(ABORT, 'the serials cannot be written (test)'); END`); err != nil {
		t.Fatal(err)
	}
	return db
}
