package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
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
			cfg, err := controlplane.APIServerTLS(of, []string{"127.0.0.1"})
			if err != nil {
				t.Fatal(err)
			}
			// Its certificate fixed (not renewed from a rotated CA).
			cert, err := cfg.GetCertificate(nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates, cfg.GetCertificate = []tls.Certificate{*cert}, nil
			hs.TLS = cfg
			hs.StartTLS()
		}
		t.Cleanup(hs.Close)
		s.url = hs.URL
		return s
	}
	cp := serve(ca, false)
	impostor := serve(other, false)
	plain := serve(ca, true)

	var logs syncBuffer
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
