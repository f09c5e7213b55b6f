package robustness

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/pgserver/pgtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestForwardRefusesNodeCertificate: a replica forwards a tenant's call
// (its Authorization header, the tenant's token) to the placement leader
// only when the certificate at the leader's address is a control plane's.
// A node's certificate from the same cluster CA names the hosts its join
// declared (any machine holding the bootstrap token may declare the
// leader's address): a replica that trusted it on the host name alone
// sent the tenant's token to whoever held a node key and the leader's
// traffic. Here the leader advertises the address of such a holder, as a
// redirection of its traffic would make it: the replica serves the call
// itself, and the holder sees no token.
func TestForwardRefusesNodeCertificate(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dbURL := pgtest.DB(t)
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	var tks []controlplane.Token
	for tenant, tok := range tokens {
		tks = append(tks, controlplane.Token{Token: tok, Tenant: tenant})
	}
	listen := func() (net.Listener, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln, "https://" + ln.Addr().String()
	}
	serve := func(ln net.Listener, h http.Handler, tc *tls.Config) {
		hs := &http.Server{Handler: h, TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			hs.ServeTLS(ln, "", "")
		}()
		t.Cleanup(func() { hs.Close() })
	}
	// start runs a replica with the cluster CA, serving at ln and
	// advertising advertise.
	start := func(ln net.Listener, advertise string) *controlplane.Server {
		st, err := postgres.Open(ctx, dbURL, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		srv, err := controlplane.New(ctx, controlplane.Config{Store: st, BootstrapToken: bootTok, Tokens: tks, CA: ca,
			Lender: controlplane.NewHTTPLender(nil), HeartbeatInterval: 500 * time.Millisecond, SuspectAfter: time.Minute, DownAfter: 2 * time.Minute,
			AdvertiseURL: advertise})
		if err != nil {
			t.Fatal(err)
		}
		tc, err := controlplane.APIServerTLS(ca, []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		serve(ln, srv.Handler(), tc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.Run(ctx)
		}()
		return srv
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
	t.Cleanup(hc.CloseIdleConnections)

	// The holder of a node key: a machine that joined with the bootstrap
	// token declaring the leader's address, 127.0.0.1.
	rogueLn, rogueURL := listen()
	lnA, urlA := listen()
	a := start(lnA, rogueURL)
	waitLeading(t, a, "A")
	csr, keyPEM, err := pki.NewCSR("", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	jr, err := api.NewClient(urlA, bootTok, hc).Join(ctx, api.JoinRequest{Name: "rogue", Address: "127.0.0.1", AgentURL: "https://127.0.0.1:1",
		Fingerprint: api.Fingerprint{MachineID: "rogue", Hostname: "rogue", Cores: 2, MemoryBytes: 1 << 30},
		Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: devSize}}, CSR: string(csr)})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair([]byte(jr.Certificate), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	serve(rogueLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "gone", http.StatusServiceUnavailable)
	}), &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})

	lnC, urlC := listen()
	start(lnC, urlC)
	cl := api.NewClient(urlC, tokens["tenant-a"], hc)
	cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: leaseSz}) // its outcome does not matter
	mu.Lock()
	defer mu.Unlock()
	for _, h := range seen {
		t.Errorf("the holder of a node certificate for the leader's address got a forwarded call, Authorization %q", h)
	}
}
