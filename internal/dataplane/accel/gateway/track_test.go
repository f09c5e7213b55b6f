package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestRedialerTrackEndsRevokedSlot: a Redialer with Track registers its
// TLS connection to the slot with a revocation list. A list taken while
// a call runs on the slot (a WebAssembly call that never returns) that
// revokes the slot's certificate ends the connection: the call fails at
// once with accel.ErrClosed wrapping pki.ErrRevoked, and the next call's
// redial is refused by the handshake. Before, the connection, verified
// at its handshake, lived on and the call ran on.
func TestRedialerTrackEndsRevokedSlot(t *testing.T) {
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(pki.Request{CommonName: "node-slots", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	crl := pki.NewCRL([]*x509.Certificate{ca.Certificate()})
	if _, err := crl.Update(ca.CRLPEM()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	app := startAppliance(t, appliance.Config{Slots: 1, SlotMemory: 1 << 16,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}})
	if err := app.Load(ctx, 0, roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()}); err != nil {
		t.Fatal(err)
	}
	if err := app.SetCredential(0, []byte("slot-key")); err != nil {
		t.Fatal(err)
	}
	addr, err := app.Addr(0)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRedialer(addr, []byte("slot-key"))
	r.TLS = func() *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), VerifyConnection: crl.VerifyPeer}
	}
	r.Track = crl.Tracker(nil)
	defer r.Close()
	if outs, err := r.CallBatch(ctx, "echo", [][]byte{[]byte("before")}); err != nil || len(outs) != 1 || string(outs[0]) != "before" {
		t.Fatalf("echo before the revocation: %q %v", outs, err)
	}

	spun := make(chan error, 1)
	go func() { _, err := r.CallBatch(ctx, "spin", [][]byte{nil}); spun <- err }()
	waitFor(t, func() bool { return busySlots(app) == 1 })
	if err := ca.Revoke(iss.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if took, err := crl.Update(ca.CRLPEM()); err != nil || !took {
		t.Fatalf("Update: %v, %v", took, err)
	}
	select {
	case err := <-spun:
		if !errors.Is(err, accel.ErrClosed) || !errors.Is(err, pki.ErrRevoked) {
			t.Fatalf("the call on the connection to the revoked slot: %v, want %v wrapping %v", err, accel.ErrClosed, pki.ErrRevoked)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call on the connection to the revoked slot still runs 10 s after the list revoking it was taken")
	}
	if _, err := r.CallBatch(ctx, "echo", [][]byte{[]byte("after")}); !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("a call after the revocation: %v, want its redial refused with %v", err, pki.ErrRevoked)
	}
}
