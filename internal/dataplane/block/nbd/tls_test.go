package nbd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and localhost and
// a client certificate directory in libnbd's layout.
type testPKI struct {
	ca        *pki.CA
	server    *tls.Config // VerifyClientCertIfGiven
	clientDir string      // ca-cert.pem, client-cert.pem, client-key.pem
	caOnlyDir string      // ca-cert.pem alone
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	ca, err := pki.Open(filepath.Join(t.TempDir(), "ca"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := ca.ServerConfig("nbd-server", []string{"127.0.0.1", "localhost"}, tls.VerifyClientCertIfGiven, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{ca: ca, server: scfg, clientDir: filepath.Join(t.TempDir(), "client"), caOnlyDir: filepath.Join(t.TempDir(), "caonly")}
	cl, err := ca.Issue(pki.Request{CommonName: "borrower", Usage: pki.ClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFiles(p.clientDir, "client", ca.CertPEM(), cl.CertPEM, cl.KeyPEM); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFiles(p.caOnlyDir, "client", ca.CertPEM(), nil, nil); err != nil {
		t.Fatal(err)
	}
	return p
}

// clientConfig trusts the test CA and presents no certificate.
func (p *testPKI) clientConfig() *tls.Config { return p.ca.ClientConfig(nil) }

// startTLSServer serves exports with TLS (required unless optional).
func startTLSServer(t testing.TB, cfg *tls.Config, optional bool, exports ...Export) (*Server, string) {
	t.Helper()
	s := &Server{TLSConfig: cfg, TLSOptional: optional}
	for _, e := range exports {
		if err := s.AddExport(e); err != nil {
			t.Fatal(err)
		}
	}
	return s, serveOn(t, s)
}

// starttls upgrades a raw connection.
func (rc *rawConn) starttls(cfg *tls.Config) {
	rc.t.Helper()
	if got := rc.optExpect(optStartTLS, nil); len(got) != 1 || got[0] != repAck {
		rc.t.Fatalf("STARTTLS: %x", got)
	}
	cfg = cfg.Clone()
	cfg.ServerName = "127.0.0.1"
	tc := tls.Client(rc.c, cfg)
	if err := tc.Handshake(); err != nil {
		rc.t.Fatal(err)
	}
	rc.c, rc.r = tc, bufio.NewReader(tc)
}

func TestTLSRoundTrip(t *testing.T) {
	p := newTestPKI(t)
	be := NewMemBackend(16 << 20)
	_, addr := startTLSServer(t, p.server, false, Export{Name: testName, Backend: be})
	c := dial(t, addr, testName, WithTLS(p.clientConfig()))
	if _, ok := c.nc.(*tlsConn); !ok {
		t.Fatalf("client connection is %T, not TLS", c.nc)
	}
	// Sizes around the TLS record size, and one larger than the maximum
	// request, which the client splits.
	for i, n := range []int{1, 512, tlsRecord - 16, tlsRecord, tlsRecord + 1, 1 << 20, 40 << 20 / 16} {
		want := bytes.Repeat([]byte{byte(i + 1)}, n)
		off := int64(i) * (1 << 20)
		if _, err := c.WriteAt(want, off); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if _, err := c.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("size %d: read back differs", n)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if !c.CanExtents() {
		t.Fatal("base:allocation not negotiated over TLS")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestTLSRequiredRefusesPlaintext: before STARTTLS, a server that requires
// TLS answers every option NBD_REP_ERR_TLS_REQD, hangs up on
// NBD_OPT_EXPORT_NAME and serves no byte.
func TestTLSRequiredRefusesPlaintext(t *testing.T) {
	p := newTestPKI(t)
	_, addr := startTLSServer(t, p.server, false, Export{Name: testName, Description: "secret-free", Backend: NewMemBackend(1 << 20)})
	for _, tc := range []struct {
		name string
		opt  uint32
		data []byte
	}{
		{"go", optGo, infoData(testName, infoBlockSize)},
		{"info", optInfo, infoData(testName, infoDescription)},
		{"list", optList, nil},
		{"structured reply", optStructuredReply, nil},
		{"set meta context", optSetMetaContext, metaData(testName, MetaContextBaseAllocation)},
		{"unknown option", 999, []byte("x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
			rc.opt(tc.opt, tc.data)
			o, typ, data, err := rc.optReply()
			if err != nil || o != tc.opt || typ != repErrTLSReqd {
				t.Fatalf("reply %d %#x %q %v, want NBD_REP_ERR_TLS_REQD", o, typ, data, err)
			}
			// The same connection may still upgrade and succeed.
			rc.starttls(p.clientConfig())
			rc.goTransmission(testName, true, true)
		})
	}
	t.Run("export name hangs up", func(t *testing.T) {
		rc := rawDial(t, addr, clientFlagFixedNewstyle|clientFlagNoZeroes)
		rc.opt(optExportName, []byte(testName))
		if !rc.closed() {
			t.Fatal("server did not hang up")
		}
	})
	t.Run("abort", func(t *testing.T) {
		rc := rawDial(t, addr, clientFlagFixedNewstyle)
		if got := rc.optExpect(optAbort, nil); len(got) != 1 || got[0] != repAck {
			t.Fatalf("abort: %x", got)
		}
	})
	t.Run("go client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, opts := range [][]DialOption{nil, {WithoutStructuredReplies()}} {
			if c, err := Dial(ctx, "tcp", addr, testName, opts...); !errors.Is(err, ErrTLSRequired) {
				if c != nil {
					c.Close()
				}
				t.Fatalf("plaintext Dial: %v, want ErrTLSRequired", err)
			}
		}
	})
}

func TestTLSOptionRules(t *testing.T) {
	p := newTestPKI(t)
	exp := Export{Name: testName, Backend: NewMemBackend(1 << 20)}
	_, forced := startTLSServer(t, p.server, false, exp)
	_, optional := startTLSServer(t, p.server, true, exp)
	_, plain := startServer(t, exp)

	t.Run("starttls twice is invalid", func(t *testing.T) {
		rc := rawDial(t, forced, clientFlagFixedNewstyle|clientFlagNoZeroes)
		rc.starttls(p.clientConfig())
		if got := rc.optExpect(optStartTLS, nil); len(got) != 1 || got[0] != repErrInvalid {
			t.Fatalf("second STARTTLS: %x", got)
		}
		rc.goTransmission(testName, true, false)
	})
	t.Run("starttls with data is invalid", func(t *testing.T) {
		rc := rawDial(t, forced, clientFlagFixedNewstyle|clientFlagNoZeroes)
		if got := rc.optExpect(optStartTLS, []byte{1}); len(got) != 1 || got[0] != repErrInvalid {
			t.Fatalf("STARTTLS with data: %x", got)
		}
	})
	t.Run("data pipelined after starttls is refused", func(t *testing.T) {
		// A man in the middle could inject plaintext options after the
		// client's STARTTLS; the server must not take them as TLS-borne.
		rc := rawDial(t, forced, clientFlagFixedNewstyle|clientFlagNoZeroes)
		var b bytes.Buffer
		b.Write(optBytes(optStartTLS, nil))
		b.Write(optBytes(optGo, infoData(testName)))
		rc.write(b.Bytes())
		if !rc.closed() {
			t.Fatal("server did not hang up")
		}
	})
	t.Run("starttls forgets structured replies", func(t *testing.T) {
		rc := rawDial(t, optional, clientFlagFixedNewstyle|clientFlagNoZeroes)
		rc.optExpect(optStructuredReply, nil)
		rc.starttls(p.clientConfig())
		if got := rc.optExpect(optSetMetaContext, metaData(testName, MetaContextBaseAllocation)); got[0] != repErrInvalid {
			t.Fatalf("set meta after STARTTLS without structured replies: %x", got)
		}
	})
	t.Run("optional serves plaintext and TLS", func(t *testing.T) {
		if c := dial(t, optional, testName); c.rs == nil {
			t.Fatalf("plaintext connection on %T, not on a raw socket", c.nc)
		}
		c := dial(t, optional, testName, WithTLS(p.clientConfig()))
		if _, ok := c.nc.(*tlsConn); !ok {
			t.Fatalf("%T", c.nc)
		}
	})
	t.Run("server without TLS refuses starttls by policy", func(t *testing.T) {
		rc := rawDial(t, plain, clientFlagFixedNewstyle|clientFlagNoZeroes)
		if got := rc.optExpect(optStartTLS, nil); len(got) != 1 || got[0] != repErrPolicy {
			t.Fatalf("STARTTLS on a plaintext server: %x", got)
		}
		// A client that wants TLS does not fall back to plaintext.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := Dial(ctx, "tcp", plain, testName, WithTLS(p.clientConfig()))
		if err == nil || !strings.Contains(err.Error(), "refused TLS") {
			t.Fatalf("TLS Dial of a plaintext server: %v", err)
		}
	})
}

// TestTLSRefusals: certificates that must not be accepted.
func TestTLSRefusals(t *testing.T) {
	p := newTestPKI(t)
	other := newTestPKI(t)
	exp := Export{Name: testName, Backend: NewMemBackend(1 << 20)}
	_, addr := startTLSServer(t, p.server, false, exp)

	// A server whose certificate expired an hour ago: issued by a CA whose
	// clock runs two hours behind, for one hour.
	past := func() time.Time { return time.Now().Add(-2 * time.Hour) }
	oldCA, err := pki.Load(p.ca.Dir(), pki.Options{Now: past})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := oldCA.Issue(pki.Request{CommonName: "nbd-server", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ec, err := expired.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	_, expiredAddr := startTLSServer(t, &tls.Config{Certificates: []tls.Certificate{ec}}, false, exp)

	// A server that requires client certificates.
	mtls, err := p.ca.ServerConfig("nbd-server", []string{"127.0.0.1"}, tls.RequireAndVerifyClientCert, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, mtlsAddr := startTLSServer(t, mtls, false, exp)
	clientCert := func(from *pki.CA, now func() time.Time, life time.Duration) *tls.Certificate {
		ca := from
		if now != nil {
			if ca, err = pki.Load(from.Dir(), pki.Options{Now: now}); err != nil {
				t.Fatal(err)
			}
		}
		iss, err := ca.Issue(pki.Request{CommonName: "borrower", Usage: pki.ClientAuth, Lifetime: life})
		if err != nil {
			t.Fatal(err)
		}
		c, err := iss.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	revoked := clientCert(p.ca, nil, 0)
	if err := p.ca.Revoke(revoked.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	withCert := func(c *tls.Certificate) *tls.Config {
		cfg := p.ca.ClientConfig(nil)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c, nil }
		return cfg
	}
	wrongName := p.clientConfig()
	wrongName.ServerName = "elsewhere.example"

	for _, tc := range []struct {
		name    string
		addr    string
		cfg     *tls.Config
		wantErr string
	}{
		{"wrong CA", addr, other.clientConfig(), "unknown authority"},
		{"expired server certificate", expiredAddr, p.clientConfig(), "expired"},
		{"server name not in the certificate", addr, wrongName, "elsewhere.example"},
		{"no client certificate", mtlsAddr, p.clientConfig(), "certificate required"},
		{"client certificate of another CA", mtlsAddr, withCert(clientCert(other.ca, nil, 0)), "unknown certificate authority"},
		{"expired client certificate", mtlsAddr, withCert(clientCert(p.ca, past, time.Hour)), "expired certificate"},
		{"revoked client certificate", mtlsAddr, withCert(revoked), "bad certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Dial(ctx, "tcp", tc.addr, testName, WithTLS(tc.cfg))
			if err == nil {
				// TLS 1.3 reports a refused client certificate only
				// at the first read.
				_, err = c.ReadAt(make([]byte, 512), 0)
				c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			t.Logf("refused: %v", err)
		})
	}
	// The good client certificate does get through.
	c := dial(t, mtlsAddr, testName, WithTLS(withCert(clientCert(p.ca, nil, 0))))
	if _, err := c.ReadAt(make([]byte, 512), 0); err != nil {
		t.Fatal(err)
	}
}

// TestTLSRemoveExport: removing an export cuts its TLS connections at once,
// as it does plaintext ones.
func TestTLSRemoveExport(t *testing.T) {
	p := newTestPKI(t)
	s, addr := startTLSServer(t, p.server, false, Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	c := dial(t, addr, testName, WithTLS(p.clientConfig()))
	if _, err := c.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.RemoveExport(testName) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("RemoveExport did not return")
	}
	if _, err := c.ReadAt(make([]byte, 4096), 0); err == nil {
		t.Fatal("read after RemoveExport succeeded")
	}
}

func TestLoadTLSDir(t *testing.T) {
	p := newTestPKI(t)
	cfg, err := LoadTLSDir(p.clientDir)
	if err != nil || len(cfg.Certificates) != 1 || cfg.RootCAs == nil {
		t.Fatalf("client dir: %v", err)
	}
	if cfg, err = LoadTLSDir(p.caOnlyDir); err != nil || len(cfg.Certificates) != 0 {
		t.Fatalf("CA-only dir: %v", err)
	}
	if _, err := LoadTLSDir(t.TempDir()); err == nil {
		t.Fatal("empty dir accepted")
	}
	half := t.TempDir()
	pki.WriteFiles(half, "client", p.ca.CertPEM(), []byte("x"), nil)
	if _, err := LoadTLSDir(half); err == nil || !strings.Contains(err.Error(), "both") {
		t.Fatalf("cert without key: %v", err)
	}
	// An nbds URI with tls-certificates dials with that directory.
	_, addr := startTLSServer(t, p.server, false, Export{Name: testName, Backend: NewMemBackend(1 << 20)})
	u := URI{Network: "tcp", Address: addr, Export: testName, TLS: true, TLSCertificates: p.caOnlyDir}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := DialURI(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	u.TLSCertificates = other(t).caOnlyDir
	if _, err := DialURI(ctx, u.String()); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("nbds URI with another CA: %v", err)
	}
}

func other(t *testing.T) *testPKI { return newTestPKI(t) }

// TestWriteBuffersTLS checks the record-coalescing writer against plain
// concatenation.
func TestWriteBuffersTLS(t *testing.T) {
	p := newTestPKI(t)
	ln := listen(t)
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer nc.Close()
		tc := tls.Server(nc, p.server)
		var b bytes.Buffer
		b.ReadFrom(tc)
		got <- b.Bytes()
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.clientConfig()
	cfg.ServerName = "127.0.0.1"
	tc := tls.Client(raw, cfg)
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	w := newTLSConn(tc, raw)
	var want bytes.Buffer
	for _, sizes := range [][]int{{16}, {16, 4096}, {16, tlsRecord}, {16, tlsRecord - 16, 3}, {3 * tlsRecord}, {16, 5*tlsRecord + 7, 16, 9}, {}} {
		var v net.Buffers
		for i, n := range sizes {
			b := bytes.Repeat([]byte{byte(i + n)}, n)
			v = append(v, b)
			want.Write(b)
		}
		if _, err := writeBuffers(w, &v); err != nil {
			t.Fatal(err)
		}
		if len(v) != 0 {
			t.Fatalf("buffers not consumed: %d left", len(v))
		}
	}
	w.closeNotify(time.Second)
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("received %d bytes, want %d (or content differs)", len(b), want.Len())
	}
}

// TestTLSTrackEndsRevokedServer: a client dialled WithTrack of a
// revocation list ends its connection as soon as the list takes a
// revocation of the server's certificate: its requests fail with
// ErrClosed, saying why (pki.ErrRevoked), while the server still runs,
// and a new dial fails the handshake. A client closed before is off the
// list: the revocation does not reach it.
func TestTLSTrackEndsRevokedServer(t *testing.T) {
	p := newTestPKI(t)
	be := NewMemBackend(1 << 20)
	_, addr := startTLSServer(t, p.server, false, Export{Name: testName, Backend: be})
	crl := pki.NewCRL([]*x509.Certificate{p.ca.Certificate()})
	if _, err := crl.Update(p.ca.CRLPEM()); err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.ca.Pool(), VerifyConnection: crl.VerifyPeer}
	log, logs := logtest.Logger(nil)
	opts := []DialOption{WithTLS(cfg), WithTrack(crl.Tracker(log))}
	c := dial(t, addr, testName, opts...)
	closed := dial(t, addr, testName, opts...)
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt([]byte("before"), 0); err != nil {
		t.Fatal(err)
	}
	leaf := c.nc.(*tlsConn).ConnectionState().PeerCertificates[0]
	if err := p.ca.Revoke(leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if took, err := crl.Update(p.ca.CRLPEM()); err != nil || !took {
		t.Fatalf("Update: %v, %v", took, err)
	}
	_, err := c.ReadAt(make([]byte, 6), 0)
	if !errors.Is(err, ErrClosed) || !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("a read on the connection to the revoked server: %v, want %v wrapping %v", err, ErrClosed, pki.ErrRevoked)
	}
	out := logs.String()
	if n := strings.Count(out, "revoked"); n != 1 || !strings.Contains(out, "serial="+leaf.SerialNumber.Text(16)) || !strings.Contains(out, "peer="+addr) {
		t.Fatalf("want one line ending the open connection, naming the peer and the serial:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c2, err := Dial(ctx, "tcp", addr, testName, opts...); !errors.Is(err, pki.ErrRevoked) {
		if err == nil {
			c2.Close()
		}
		t.Fatalf("a new dial of the revoked server: %v, want %v", err, pki.ErrRevoked)
	}
	if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Close after the end: %v", err)
	}
}
