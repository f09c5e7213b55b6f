package accel

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"

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
