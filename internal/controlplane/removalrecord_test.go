package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestLateRemovalRevokedRecorded: a certificate renewal authenticated
// before a node's forced removal signs while the removal's commit waits
// for the database (another connection holds its write lock): the
// removal's second revocation pass, after its commit, revokes that
// certificate, and the write that records its serial with the removal
// (AddRemovalRevoked) fails — the database refuses it (a trigger of its
// own raises an error on it, and on no other write). The serial is not
// lost to the replicas that call the removed node's agent later (a failed
// move's destination there): the removing replica accepts it at once (it
// holds it), and records it once the database takes the write again, at
// its next sweep. Before, the failure was only logged: the store never
// had the serial, and a teardown or abort on another replica, or on this
// one after a restart, refused the agent presenting that certificate.
func TestLateRemovalRevokedRecorded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rialto.db")
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := New(ctx, Config{Store: st, CA: ca, Lender: newFakeLender(), BootstrapToken: bootTok,
		Tokens: []Token{{Token: adminTok, Tenant: "ops", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(srv.Handler())
	cfg, err := APIServerTLS(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	apiCert, err := cfg.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates, cfg.GetCertificate = []tls.Certificate{*apiCert}, nil
	hs.TLS = cfg
	hs.StartTLS()
	t.Cleanup(hs.Close)
	client := func(cert *tls.Certificate) *http.Client {
		tc := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		// A request with Expect: 100-continue sends its body only once
		// the handler reads it.
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ExpectContinueTimeout: time.Minute}}
	}
	anon := api.NewClient(hs.URL, "", client(nil))
	csr, keyPEM, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	j, err := anon.WithToken(bootTok).Join(ctx, api.JoinRequest{Name: "n1", Address: "127.0.0.1", AgentURL: "https://127.0.0.1:1",
		Fingerprint: api.Fingerprint{MachineID: "mid-n1", Hostname: "n1", Cores: 2, MemoryBytes: 1 << 30},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"}},
		CSR:         string(csr)})
	if err != nil {
		t.Fatal(err)
	}
	joined, err := pki.ParseCerts([]byte(j.Certificate))
	if err != nil || len(joined) == 0 {
		t.Fatalf("the join's certificate: %v", err)
	}
	cert, err := tls.X509KeyPair([]byte(j.Certificate), keyPEM)
	if err != nil {
		t.Fatal(err)
	}

	// The renewal: authenticated now (credential and certificate), its
	// body sent once the removal has revoked the node's certificates.
	csr2, _, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(api.NodeCertificateRequest{CSR: string(csr2)})
	pr, pw := io.Pipe()
	reading := make(chan struct{})
	rctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got100Continue: func() { close(reading) }})
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, hs.URL+"/v1/nodes/"+j.NodeID+"/certificate", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+j.Credential)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	type answer struct {
		resp *http.Response
		err  error
	}
	renewed := make(chan answer, 1)
	go func() { // the test waits for it below
		resp, err := client(&cert).Do(req)
		renewed <- answer{resp, err}
	}()
	select {
	case <-reading:
	case a := <-renewed:
		t.Fatalf("the renewal was answered before it sent its body: %v", a.err)
	}

	// The database's write lock, held by a connection of the test's own:
	// the removal's commit waits for it.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	type removal struct {
		r   api.NodeRemoval
		err error
	}
	removed := make(chan removal, 1)
	go func() { // the test waits for it below
		r, err := anon.WithToken(adminTok).RemoveNode(ctx, j.NodeID, true)
		removed <- removal{r, err}
	}()
	pollUntil(ctx, t, "the removal's first revocation", func() bool { return ca.Revoked(joined[0].SerialNumber) })
	if _, err := io.Copy(pw, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	a := <-renewed
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.resp.Body.Close()
	if a.resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(a.resp.Body)
		t.Fatalf("the renewal before the removal's commit: %s %s", a.resp.Status, data)
	}
	var out api.NodeCertificateResponse
	if err := json.NewDecoder(a.resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	renewal, err := pki.ParseCerts([]byte(out.Certificate))
	if err != nil || len(renewal) == 0 {
		t.Fatalf("the renewal's certificate: %v", err)
	}
	late := renewal[0].SerialNumber.Text(16)
	// From the commit of the lock on, the database refuses any write of
	// the serials that names the renewal's: the second pass's.
	if _, err := conn.ExecContext(ctx, `CREATE TRIGGER test_refuse_late_serial BEFORE UPDATE OF removal_revoked ON nodes
		WHEN instr(NEW.removal_revoked, '`+late+`') > 0 BEGIN SELECT RAISE(ABORT, 'the serials cannot be written (test)'); END`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	rm := <-removed
	if rm.err != nil {
		t.Fatal(rm.err)
	}
	if rm.r.Revoked != 2 || !ca.Revoked(renewal[0].SerialNumber) {
		t.Fatalf("the removal revoked %d certificate(s), the renewal's revoked: %v; want 2, the join's and the renewal's",
			rm.r.Revoked, ca.Revoked(renewal[0].SerialNumber))
	}
	recorded := func() []string {
		t.Helper()
		got, err := st.RemovalRevoked(ctx, j.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := recorded(); slices.Contains(got, late) || !slices.Contains(got, joined[0].SerialNumber.Text(16)) {
		t.Fatalf("recorded with the removal: %v; want the join's certificate's serial, not yet the renewal's %s", got, late)
	}
	// Meanwhile this replica's calls to the node's agent accept it.
	if got := serialTexts(srv.removalRevoked(ctx, j.NodeID)); !slices.Contains(got, late) {
		t.Errorf("this replica accepts %v of the removed node's certificates, not the renewal's %s", got, late)
	}

	// The database takes the write again: the next sweep records it.
	if _, err := conn.ExecContext(ctx, `DROP TRIGGER test_refuse_late_serial`); err != nil {
		t.Fatal(err)
	}
	if err := srv.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := recorded(); !slices.Contains(got, late) || !slices.Contains(got, joined[0].SerialNumber.Text(16)) {
		t.Errorf("recorded after the sweep: %v; want the join's certificate's serial and the renewal's %s", got, late)
	}
}
