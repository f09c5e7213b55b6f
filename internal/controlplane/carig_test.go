package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
	"github.com/rialto-project/rialto/internal/pki"
)

// caSQLite is a control plane with a cluster CA of its own on a SQLite
// store of its own (newCASQLite).
type caSQLite struct {
	ca   *pki.CA
	st   *sqlite.Store
	path string // the database file
	srv  *Server
}

// newCASQLite starts a control plane with cfg, given a new CA directory
// and SQLite database (cfg's Store and CA are set here); a nil Lender is a
// fake one, an empty BootstrapToken bootTok, no Tokens the admin token. It
// and its store close when the test ends.
func newCASQLite(ctx context.Context, t *testing.T, cfg Config) caSQLite {
	t.Helper()
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
	cfg.Store, cfg.CA = st, ca
	if cfg.Lender == nil {
		cfg.Lender = newFakeLender()
	}
	if cfg.BootstrapToken == "" {
		cfg.BootstrapToken = bootTok
	}
	if cfg.Tokens == nil {
		cfg.Tokens = []Token{{Token: adminTok, Tenant: "ops", Admin: true}}
	}
	srv, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return caSQLite{ca: ca, st: st, path: path, srv: srv}
}

// reopenSQLite ends r's replica (its server and store closed, as its
// process ends) and starts another on the same database and CA
// directory, stopped when the test ends.
func reopenSQLite(ctx context.Context, t *testing.T, r caSQLite) (*sqlite.Store, *pki.CA, *Server) {
	t.Helper()
	r.srv.Close()
	r.st.Close()
	st, err := sqlite.Open(ctx, r.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, err := pki.Open(r.ca.Dir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(ctx, Config{Store: st, CA: ca, Lender: newFakeLender(), BootstrapToken: bootTok,
		Tokens: []Token{{Token: adminTok, Tenant: "ops", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return st, ca, srv
}

// serveTLS serves s's API over HTTPS on loopback with a certificate of
// ca (for 127.0.0.1), until the test ends, and returns its URL.
func serveTLS(t *testing.T, s *Server, ca *pki.CA) string {
	t.Helper()
	hs := httptest.NewUnstartedServer(s.Handler())
	cfg, err := APIServerTLS(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	// Its certificate fixed: httptest would put its own first.
	cert, err := cfg.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates, cfg.GetCertificate = []tls.Certificate{*cert}, nil
	hs.TLS = cfg
	hs.StartTLS()
	t.Cleanup(hs.Close)
	return hs.URL
}

// joinN1 is the join of node n1 (machine mid-n1, one partitionable 1 GiB
// disk) with csr.
func joinN1(csr []byte) api.JoinRequest {
	return api.JoinRequest{Name: "n1", Address: "127.0.0.1", AgentURL: "https://127.0.0.1:1",
		Fingerprint: api.Fingerprint{MachineID: "mid-n1", Hostname: "n1", Cores: 2, MemoryBytes: 1 << 30},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Sharing: "partitionable"}},
		CSR:         string(csr)}
}

// joinN1Cert joins node n1 to s with a CSR of its own and returns the
// answer and the node certificate it carries.
func joinN1Cert(ctx context.Context, t *testing.T, s *Server) (api.JoinResponse, *x509.Certificate) {
	t.Helper()
	csr, _, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	j, err := s.joinAs(ctx, joinN1(csr), "")
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCerts([]byte(j.Certificate))
	if err != nil || len(certs) == 0 {
		t.Fatalf("the join's certificate: %v", err)
	}
	return j, certs[0]
}
