package robustness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// metricOf reads one sample of srv's /metrics (see metric).
func metricOf(t *testing.T, srv *controlplane.Server, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if err := json.Unmarshal([]byte(strings.TrimSpace(rest)), &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// TestForwardingOverTLS: replicas serving HTTPS forward to the placement
// leader only over a connection whose certificate they verify. Replica A
// leads; C trusts the cluster CA and forwards to A; B trusts another CA
// only, so its forward is refused at the TLS handshake (before any byte
// of the call left) and B serves the call itself, without a key and
// without an error. A call with a bad token is refused where it landed.
func TestForwardingOverTLS(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dbURL := pgtest.DB(t)
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	var tks []controlplane.Token
	for tenant, tok := range tokens {
		tks = append(tks, controlplane.Token{Token: tok, Tenant: tenant})
	}
	start := func(trust *x509.CertPool) (string, *controlplane.Server) {
		st, err := postgres.Open(ctx, dbURL, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "https://" + ln.Addr().String()
		srv, err := controlplane.New(ctx, controlplane.Config{Store: st, BootstrapToken: bootTok, Tokens: tks,
			Lender: controlplane.NewHTTPLender(nil), HeartbeatInterval: 500 * time.Millisecond, SuspectAfter: time.Minute, DownAfter: 2 * time.Minute,
			AdvertiseURL: url, PeerTLS: &tls.Config{RootCAs: trust, MinVersion: tls.VersionTLS12}})
		if err != nil {
			t.Fatal(err)
		}
		sc, err := ca.ServerConfig("rialto control plane", []string{"127.0.0.1"}, tls.NoClientCert, 0)
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: srv.Handler(), TLSConfig: sc, ReadHeaderTimeout: 10 * time.Second}
		wg.Add(2)
		go func() {
			defer wg.Done()
			hs.ServeTLS(ln, "", "")
		}()
		go func() {
			defer wg.Done()
			srv.Run(ctx)
		}()
		t.Cleanup(func() { hs.Close() })
		return url, srv
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
	t.Cleanup(hc.CloseIdleConnections)

	urlA, a := start(ca.Pool())
	waitLeading(t, a, "A")
	urlB, b := start(other.Pool())
	urlC, c := start(ca.Pool())

	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/agent/v1/prepare":
			var req api.PrepareRequest
			json.NewDecoder(r.Body).Decode(&req)
			json.NewEncoder(w).Encode(api.PrepareResponse{URI: "nbd://127.0.0.1:10809/" + req.Export})
		default:
			w.Write([]byte("{}"))
		}
	}))
	t.Cleanup(agent.Close)
	if _, err := api.NewClient(urlA, bootTok, hc).Join(ctx, api.JoinRequest{Name: "tls0", Address: "127.0.0.1", AgentURL: agent.URL,
		Fingerprint: api.Fingerprint{MachineID: "tls-0", Hostname: "tls0", Cores: 2, MemoryBytes: 1 << 30},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: devSize, Sharing: "partitionable"}}}); err != nil {
		t.Fatal(err)
	}

	for _, x := range []struct {
		name string
		url  string
		srv  *controlplane.Server
		fwd  float64 // calls forwarded: a creation and a release each
	}{{"C (trusts the CA)", urlC, c, 2}, {"B (trusts another CA)", urlB, b, 0}} {
		cl := api.NewClient(x.url, tokens["tenant-a"], hc)
		l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz})
		if err != nil {
			t.Fatalf("%s: create: %v", x.name, err)
		}
		if _, err := cl.ReleaseLease(ctx, l.ID); err != nil {
			t.Fatalf("%s: release: %v", x.name, err)
		}
		if got := metricOf(t, x.srv, forwarded); got != x.fwd {
			t.Errorf("%s forwarded %v calls, want %v", x.name, got, x.fwd)
		}
		if got := metricOf(t, x.srv, `rialto_forwarded_calls_total{outcome="ambiguous"}`); got != 0 {
			t.Errorf("%s answered %v calls 503", x.name, got)
		}
	}
	if got := metricOf(t, b, `rialto_forwarded_calls_total{outcome="local"}`); got != 2 {
		t.Errorf("B served %v calls itself, want 2", got)
	}
	// A bad token is refused where it landed, not forwarded.
	_, err = api.NewClient(urlC, "not-a-token", hc).CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz})
	if !api.IsCode(err, api.CodeUnauthorized) {
		t.Fatalf("bad token through C: %v", err)
	}
	if got := metricOf(t, c, forwarded); got != 2 {
		t.Errorf("C forwarded a call with a bad token (%v forwarded)", got)
	}
}

// waitLeading waits (polling, up to 15 s) until s leads its replicas.
func waitLeading(t *testing.T, s interface{ Leading() bool }, name string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !s.Leading() {
		if time.Now().After(deadline) {
			t.Fatal(name + " does not lead")
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}
