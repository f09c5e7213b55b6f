package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
	"github.com/rialto-project/rialto/internal/pgserver"
)

// backend is a store configuration to measure.
type backend struct {
	name     string
	sqlite   string           // SQLite: directory of the database files
	pg       *pgserver.Server // PostgreSQL: the server
	replicas int              // PostgreSQL: control-plane replicas sharing it
	seq      *int             // databases made so far (names)
}

// cluster is a running control plane: one server, or several replicas
// sharing a PostgreSQL database, in this process.
type cluster struct {
	dials  atomic.Int64 // connections the client opened
	urls   []string
	srvs   []*controlplane.Server
	stop   func()
	client *http.Client
}

// urlFor is the address list a client w uses: every replica, starting
// with w's own share of them, so that clients spread over the replicas
// and fail over to the others.
func (c *cluster) urlFor(w int) string {
	n := len(c.urls)
	out := make([]string, n)
	for i := range out {
		out[i] = c.urls[(w+i)%n]
	}
	return strings.Join(out, ",")
}

// start runs the control plane of b, over HTTPS when tlsOn (a certificate
// of an in-process P-256 CA, as `rialto server` serves by default; no
// client certificates: the agents share one pool of connections).
func start(ctx context.Context, b backend, cfgMod func(*controlplane.Config), tlsOn bool) (*cluster, error) {
	var srvTLS, cliTLS *tls.Config
	if tlsOn {
		var err error
		if srvTLS, cliTLS, err = selfSigned(); err != nil {
			return nil, err
		}
	}
	*b.seq++
	var stores []store.Store
	closeAll := func() {
		for _, st := range stores {
			st.Close()
		}
	}
	if b.pg == nil {
		st, err := sqlite.Open(ctx, fmt.Sprintf("%s/bench-%d.db", b.sqlite, *b.seq))
		if err != nil {
			return nil, err
		}
		stores = append(stores, st)
	} else {
		db := fmt.Sprintf("bench_%d", *b.seq)
		if err := b.pg.CreateDatabase(ctx, db); err != nil {
			return nil, err
		}
		for range b.replicas {
			st, err := postgres.Open(ctx, b.pg.URL(db), postgres.Options{})
			if err != nil {
				closeAll()
				return nil, err
			}
			stores = append(stores, st)
		}
	}
	c := &cluster{}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var stops []func()
	for _, st := range stores {
		cfg := controlplane.Config{
			Store: st, BootstrapToken: bootTok, Tokens: []controlplane.Token{{Token: tenantTok, Tenant: "bench"}},
			// Liveness thresholds are generous so that scheduling noise on a
			// loaded machine does not mark agents down.
			SuspectAfter: 30 * time.Second, DownAfter: 60 * time.Second,
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			cancel()
			closeAll()
			return nil, err
		}
		url := "http://" + ln.Addr().String()
		if srvTLS != nil {
			url = "https://" + ln.Addr().String()
			cfg.PeerTLS = cliTLS // a replica forwards to the leader over HTTPS
		}
		if b.pg != nil {
			// Replicas forward creations and releases to the elected one
			// (the placement leader), which they reach at this address.
			cfg.AdvertiseURL = url
		}
		if cfgMod != nil {
			cfgMod(&cfg)
		}
		srv, err := controlplane.New(ctx, cfg)
		if err != nil {
			ln.Close()
			cancel()
			closeAll()
			return nil, err
		}
		stop := serveOn(ln, srv.Handler(), srvTLS)
		stops = append(stops, stop)
		c.urls = append(c.urls, url)
		c.srvs = append(c.srvs, srv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.Run(rctx)
		}()
	}
	// At most maxConns connections to each server: 10,000 agents in one
	// process would otherwise open a connection each (and the server
	// another) when answers slow down, and run out of file descriptors.
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{TLSClientConfig: cliTLS, MaxIdleConns: 4096, MaxIdleConnsPerHost: maxConns, MaxConnsPerHost: maxConns, IdleConnTimeout: time.Minute,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c.dials.Add(1)
			return d.DialContext(ctx, network, addr)
		}}
	c.client = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	c.stop = func() {
		cancel()
		wg.Wait()
		for _, s := range stops {
			s()
		}
		closeAll()
		tr.CloseIdleConnections()
	}
	return c, nil
}

// selfSigned returns a server configuration with a P-256 certificate for
// 127.0.0.1 and a client configuration that trusts it.
func selfSigned() (*tls.Config, *tls.Config, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench control plane"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: k}}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: pool}, nil
}

// maxConns bounds the client's connections to each server.
const maxConns = 512

// warm opens the client's connections to every server (up to maxConns
// each) before a measurement, as agents that each hold a connection
// would have: handshakes (TLS) are then not measured.
func (c *cluster) warm(ctx context.Context) {
	want := int64(maxConns * len(c.urls))
	for round := 0; round < 20 && c.dials.Load() < want; round++ {
		var wg sync.WaitGroup
		for _, u := range c.urls {
			for range maxConns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, err := http.NewRequestWithContext(ctx, "GET", u+"/v1/warm", nil)
					if err != nil {
						return
					}
					if r, err := c.client.Do(req); err == nil {
						io.Copy(io.Discard, r.Body)
						r.Body.Close()
					}
				}()
			}
		}
		wg.Wait()
	}
}

// interval waits (up to 20 s) until every server tells agents the same
// heartbeat interval, at least least (rialto_heartbeat_interval_seconds),
// and returns it; the longest told when they do not agree in time.
func (c *cluster) interval(ctx context.Context, least time.Duration) time.Duration {
	deadline := time.Now().Add(20 * time.Second)
	for {
		lo, hi := time.Duration(-1), time.Duration(0)
		for _, u := range c.urls {
			d := c.told(ctx, u)
			if lo < 0 || d < lo {
				lo = d
			}
			hi = max(hi, d)
		}
		if lo == hi && hi >= least || time.Now().After(deadline) || ctx.Err() != nil {
			if lo != hi {
				log.Printf("replicas still tell different heartbeat intervals (%v to %v)", lo, hi)
			}
			return max(hi, least)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// told is the heartbeat interval the server at u tells agents (0 when
// it cannot be read).
func (c *cluster) told(ctx context.Context, u string) time.Duration {
	req, err := http.NewRequestWithContext(ctx, "GET", u+"/metrics", nil)
	if err != nil {
		return 0
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rialto_heartbeat_interval_seconds "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return time.Duration(f * float64(time.Second))
		}
	}
	return 0
}
