package accel

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/pki"
)

// TestTLS: a server that requires TLS serves a TLS client (tasks and slot
// memory alike), answers a plaintext HELLO with CodeTLSRequired (the
// client sees ErrTLSRequired), and a TLS client meeting a plaintext
// server, or trusting another CA, fails before its credential is sent.
func TestTLS(t *testing.T) {
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := ca.ServerConfig("node-1", []string{"127.0.0.1"}, tls.NoClientCert, 0)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &Server{Target: &memTarget{mem: make([]byte, 1<<20)}, TLS: scfg}
	go func() { done <- s.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	addr := ln.Addr().String()
	plainAddr := startServer(t, &memTarget{mem: make([]byte, 1<<20)}, 0)
	good, err := pki.LoadClientTLS(ca.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	bad, err := pki.LoadClientTLS(other.CertFile())
	if err != nil {
		t.Fatal(err)
	}

	c, err := Dial(ctx, addr, []byte("lease-secret"), WithTLS(good))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := bytes.Repeat([]byte("tls"), 100000)
	if err := c.WriteMem(ctx, 4096, big); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadMem(ctx, 4096, uint32(len(big))); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("slot memory over TLS: %v", err)
	}
	if out, err := c.Call(ctx, "echo", []byte("hello")); err != nil || string(out) != "hello" {
		t.Fatalf("echo over TLS: %q %v", out, err)
	}
	if _, err := Dial(ctx, addr, []byte("wrong"), WithTLS(good)); !errors.Is(err, ErrAuth) {
		t.Errorf("wrong credential over TLS: %v", err)
	}
	if _, err := Dial(ctx, addr, []byte("lease-secret")); !errors.Is(err, ErrTLSRequired) {
		t.Errorf("plaintext client: %v, want ErrTLSRequired", err)
	}
	if _, err := Dial(ctx, addr, []byte("lease-secret"), WithTLS(bad)); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("client trusting another CA: %v", err)
	}
	if _, err := Dial(ctx, plainAddr, []byte("lease-secret"), WithTLS(good)); err == nil || !strings.Contains(err.Error(), "does not speak TLS") {
		t.Errorf("TLS client, plaintext server: %v", err)
	}
}

// TestTrackEndsRevokedTarget: a connection over TLS registered with a
// revocation list (WithTrack) is ended as soon as the list takes a
// revocation of the target's certificate, the target still serving: the
// call in flight on it (a task that would run until released) fails
// with ErrClosed wrapping pki.ErrRevoked, later calls likewise, the
// target sees the connection end (the task is interrupted), the end is
// logged naming the target's address and the serial number, and a new
// dial is refused at the handshake. Before, the call waited for the
// task, and the connection went on serving.
func TestTrackEndsRevokedTarget(t *testing.T) {
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(pki.Request{CommonName: "node-revoked", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	tgt := &memTarget{mem: make([]byte, 1<<20), release: make(chan struct{})}
	defer close(tgt.release)
	s := &Server{Target: tgt, TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}}
	sctx, scancel := context.WithCancel(context.Background())
	go func() { done <- s.Serve(sctx, ln) }()
	defer func() { scancel(); <-done }()
	addr := ln.Addr().String()

	crl := pki.NewCRL([]*x509.Certificate{ca.Certificate()})
	if _, err := crl.Update(ca.CRLPEM()); err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), VerifyConnection: crl.VerifyPeer}
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	c, err := Dial(ctx, addr, []byte("lease-secret"), WithTLS(cfg), WithTrack(crl.Tracker(log)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := c.Call(ctx, "echo", []byte("before")); err != nil || string(out) != "before" {
		t.Fatalf("echo: %q %v", out, err)
	}
	called := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, "block", []byte("x"))
		called <- err
	}()
	waitUntil(t, "the task to run", func() bool { return tgt.blocked.Load() == 1 })

	if err := ca.Revoke(iss.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if took, err := crl.Update(ca.CRLPEM()); err != nil || !took {
		t.Fatalf("Update: %v, %v", took, err)
	}
	if err := <-called; !errors.Is(err, ErrClosed) || !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("the call in flight on the connection to the revoked target: %v, want %v wrapping %v", err, ErrClosed, pki.ErrRevoked)
	}
	if err := c.Ping(ctx); !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("a call after the revocation: %v, want %v", err, pki.ErrRevoked)
	}
	mu.Lock()
	line := logs.String()
	mu.Unlock()
	for _, want := range []string{"ending a TLS connection: its peer's certificate is revoked", "peer=" + addr, "serial=" + iss.Cert.SerialNumber.Text(16)} {
		if !strings.Contains(line, want) {
			t.Fatalf("the log does not say %q:\n%s", want, line)
		}
	}
	waitUntil(t, "the target to interrupt the task of the ended connection", func() bool {
		return tgt.interrupted.Load() == 1 && tgt.blocked.Load() == 0
	})
	if _, err := Dial(ctx, addr, []byte("lease-secret"), WithTLS(cfg), WithTrack(crl.Tracker(log))); !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("a new dial of the revoked target: %v, want %v", err, pki.ErrRevoked)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
