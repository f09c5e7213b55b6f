package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestCAFollowerTakesOnlyVerifiedCABundles: an attachment's CA follower
// takes the CA certificates an answer of GET /v1/ca-certificates carries
// only from a control plane it verified with the certificates it holds,
// and only CA certificates. A bundle holding a server certificate (whose
// key's holder would be trusted as any control plane and lender) is
// refused, and warned about once; a server of another CA presenting a
// control plane's name is not believed (the handshake fails), nor is one
// reached over plain HTTP (not even asked); the rotated bundle of the
// cluster's control plane is taken, and an operator's new --cacert file
// wins over it.
func TestCAFollowerTakesOnlyVerifiedCABundles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	caDir := t.TempDir()
	ca, err := pki.Open(caDir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "cafollow-ca-cert.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	held := ca.CertHash()
	leaf, err := ca.Issue(pki.Request{CommonName: "node-x", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}

	// A control plane's API answering GET /v1/ca-certificates with
	// whatever bundle the test sets, with an API certificate of ca (as
	// the cluster's does) or of another CA (an impostor), or over HTTP.
	type server struct {
		url    string
		bundle atomic.Pointer[string]
		asked  atomic.Int64
	}
	serve := func(of *pki.CA, plain bool) *server {
		t.Helper()
		s := &server{}
		hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || r.URL.Path != "/v1/ca-certificates" {
				http.NotFound(w, r)
				return
			}
			s.asked.Add(1)
			pem := *s.bundle.Load()
			var out api.CACertificates
			if certs, err := pki.ParseCerts([]byte(pem)); err == nil {
				out.CAHash = pki.CertsHash(certs)
			}
			if out.CAHash != r.URL.Query().Get("ca_hash") {
				out.CACertificate = pem
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(out)
		}))
		if plain {
			hs.Start()
		} else {
			startFixedTLS(t, hs, of)
		}
		t.Cleanup(hs.Close)
		s.url = hs.URL
		return s
	}
	cp := serve(ca, false)
	impostor := serve(other, false)
	plain := serve(ca, true)

	var logs logtest.Buffer
	follower := func(s *server) (*caFollower, *clientFlags) {
		t.Helper()
		cf := &clientFlags{addr: s.url, caCert: caFile, token: "cafollow-token"}
		if err := cf.followRoots(); err != nil {
			t.Fatal(err)
		}
		c, err := cf.client()
		if err != nil {
			t.Fatal(err)
		}
		return cf.caFollower(c, slog.New(slog.NewTextHandler(&logs, nil))), cf
	}

	// `rialto ca rotate` of the cluster's CA directory.
	rotator, err := pki.Load(caDir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rotator.Rotate(); err != nil {
		t.Fatal(err)
	}
	rotated := string(rotator.CertPEM())

	f, cf := follower(cp)
	bad := string(leaf.CertPEM) + rotated
	cp.bundle.Store(&bad)
	for range 2 {
		if f.check(ctx) || cf.roots.Hash() != held {
			t.Fatal("a bundle with a server certificate was taken")
		}
	}
	if n := strings.Count(logs.String(), "refused"); n != 1 || !strings.Contains(logs.String(), "not a CA certificate") {
		t.Fatalf("the refusal was logged %d times, want once with why:\n%s", n, logs.String())
	}

	otherPEM := string(other.CertPEM())
	impostor.bundle.Store(&otherPEM)
	fi, cfi := follower(impostor)
	if fi.check(ctx) || cfi.roots.Hash() != held {
		t.Fatal("a bundle from a server the held CA certificates do not verify was taken")
	}
	if impostor.asked.Load() != 0 {
		t.Fatal("the impostor was sent the request")
	}
	plain.bundle.Store(&rotated)
	fp, cfp := follower(plain)
	if fp.check(ctx) || cfp.roots.Hash() != held || plain.asked.Load() != 0 {
		t.Fatalf("over plain HTTP: asked %d times, bundle taken: %v", plain.asked.Load(), cfp.roots.Hash() != held)
	}

	cp.bundle.Store(&rotated)
	if !f.check(ctx) || cf.roots.Hash() != rotator.CertHash() {
		t.Fatal("the control plane's rotated bundle was not taken")
	}
	if f.check(ctx) {
		t.Fatal("the bundle in use was taken again")
	}
	// An operator's new --cacert file wins over it.
	if err := os.WriteFile(caFile, other.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if !f.check(ctx) || cf.roots.Hash() != other.CertHash() {
		t.Fatal("the operator's new --cacert file was not taken")
	}
}

// TestCAFollowerTakesOnlyNewerSignedCRLs: an attachment's CA follower
// takes the revocation list an answer of GET /v1/ca-certificates carries
// only if a CA certificate it verifies with signed it and its number is
// higher than that of the list it holds, sends that number (crl_number),
// and from then on refuses, at a dial, the lenders it names. A list of
// another CA, even with a higher number, is refused (warned about once)
// and does not change what is refused; an older list of the cluster's CA
// (a stale answer) is not taken; and the ca-crl.pem beside --cacert still
// counts: a newer one there wins over the control plane's.
func TestCAFollowerTakesOnlyNewerSignedCRLs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	caDir := t.TempDir() // the borrower's copy of ca-cert.pem, no list beside it
	caFile := filepath.Join(caDir, "cafollow-crl-ca-cert.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	lender := func() *x509.Certificate {
		t.Helper()
		iss, err := ca.Issue(pki.Request{CommonName: "node-crl", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth})
		if err != nil {
			t.Fatal(err)
		}
		certs, err := pki.ParseCerts(iss.CertPEM)
		if err != nil {
			t.Fatal(err)
		}
		return certs[0]
	}
	revoked, other := lender(), lender()
	empty, n0 := string(ca.CRLPEM()), ca.CRLNumber().Int64()
	if err := ca.Revoke(revoked.SerialNumber); err != nil {
		t.Fatal(err)
	}
	first, n1 := string(ca.CRLPEM()), ca.CRLNumber().Int64() // names revoked
	// Another CA's list, of a higher number, naming the other lender.
	impostor, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := impostor.Revoke(lender().SerialNumber); err != nil {
			t.Fatal(err)
		}
	}
	if err := impostor.Revoke(other.SerialNumber); err != nil {
		t.Fatal(err)
	}
	foreign := string(impostor.CRLPEM())
	if impostor.CRLNumber().Cmp(ca.CRLNumber()) <= 0 {
		t.Fatalf("the other CA's list is number %v, not higher than the CA's %v", impostor.CRLNumber(), ca.CRLNumber())
	}

	// The cluster's control plane, answering whatever list the test sets
	// whatever the caller holds (a stale replica would), and noting the
	// crl_number asked with.
	var offered atomic.Pointer[string]
	var asked atomic.Pointer[string]
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/ca-certificates" {
			http.NotFound(w, r)
			return
		}
		n := r.URL.Query().Get("crl_number")
		asked.Store(&n)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.CACertificates{CAHash: ca.CertHash(), CRL: *offered.Load()})
	}))
	startFixedTLS(t, hs, ca)
	t.Cleanup(hs.Close)

	var logs logtest.Buffer
	cf := &clientFlags{addr: hs.URL, caCert: caFile, token: "cafollow-token"}
	if err := cf.followRoots(); err != nil {
		t.Fatal(err)
	}
	c, err := cf.client()
	if err != nil {
		t.Fatal(err)
	}
	f := cf.caFollower(c, slog.New(slog.NewTextHandler(&logs, nil)))
	// What a dial of a lender presenting cert is told (ClientTLS's check).
	dial := func(cert *x509.Certificate) error {
		return cf.roots.ClientTLS().VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}})
	}
	expect := func(when string, number int64, refused ...*x509.Certificate) {
		t.Helper()
		if got := f.crlNumber(); got != number {
			t.Fatalf("%s: the list held is number %d, want %d", when, got, number)
		}
		for _, l := range []*x509.Certificate{revoked, other} {
			err := dial(l)
			if want := slices.Contains(refused, l); want != errors.Is(err, pki.ErrRevoked) {
				t.Fatalf("%s: a dial of lender %s: %v (want it refused: %v)", when, l.SerialNumber.Text(16), err, want)
			}
		}
	}
	if n0 >= n1 {
		t.Fatalf("the CA's list numbers: %d, then %d", n0, n1)
	}
	expect("at the start", 0)

	offered.Store(&foreign)
	for range 2 {
		if f.check(ctx) {
			t.Fatal("another CA's list was taken")
		}
	}
	if n := strings.Count(logs.String(), "revocation list is refused"); n != 1 || !strings.Contains(logs.String(), "not signed by a trusted CA") {
		t.Fatalf("the refused list was logged %d times, want once with why:\n%s", n, logs.String())
	}
	expect("offered another CA's list", 0)

	offered.Store(&first)
	if !f.check(ctx) {
		t.Fatal("the control plane's newer list was not taken")
	}
	expect("offered the CA's newer list", n1, revoked)
	if f.check(ctx) {
		t.Fatal("the list held was taken again")
	}
	if a := asked.Load(); a == nil || *a != strconv.FormatInt(n1, 10) {
		t.Fatalf("asked with crl_number %v, want %d (the list held)", a, n1)
	}

	offered.Store(&empty)
	if f.check(ctx) {
		t.Fatal("an older list of the CA was taken")
	}
	expect("offered the CA's older list", n1, revoked)

	// A newer list beside --cacert (an operator copied it) wins; the
	// control plane's older one stays refused.
	if err := ca.Revoke(other.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(caDir, pki.CRLFile), ca.CRLPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	offered.Store(&first)
	f.check(ctx)
	n2 := ca.CRLNumber().Int64()
	expect("a newer list beside --cacert", n2, revoked, other)
	if a := asked.Load(); a == nil || *a != strconv.FormatInt(n2, 10) {
		t.Fatalf("asked with crl_number %v, want %d (the file's)", a, n2)
	}
}

// startFixedTLS starts hs with a control plane's API configuration of ca
// for 127.0.0.1, its certificate fixed (not renewed from a rotated CA).
func startFixedTLS(t *testing.T, hs *httptest.Server, ca *pki.CA) {
	t.Helper()
	cfg, err := controlplane.APIServerTLS(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := cfg.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates, cfg.GetCertificate = []tls.Certificate{*cert}, nil
	hs.TLS = cfg
	hs.StartTLS()
}
