package pki

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestBundleIsCanonical: a control plane that followed a `rialto ca
// rotate` of its directory while running (which keeps signing with its
// own key, the old CA's) hands out the CA bundle that one started on the
// rotated directory hands out, byte for byte and by hash, and that bundle
// is the directory's ca-cert.pem: the new CA first. CertsHash does not
// depend on the certificates' order, so a client holding them in another
// order (Roots.Use, an agent's heartbeat) has them already. Before, the
// running control plane kept its signing certificate first and the
// restarted one the new CA: the hashes differed, and every agent and
// attach took the same certificates again once the control plane
// restarted, logging a change that was none.
func TestBundleIsCanonical(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	running := openCA(t, dir, clk)
	// The rotation within the second of the CA's making (the clock
	// stands still): the new CA is still the newest.
	if err := openCA(t, dir, clk).Rotate(); err != nil {
		t.Fatal(err)
	}
	if _, err := running.ReloadIfChanged(); err != nil {
		t.Fatal(err)
	}
	restarted := openCA(t, dir, clk)
	file, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseCerts(running.CertPEM()); err != nil || len(got) != 2 {
		t.Fatalf("the running control plane's bundle: %d certificates (%v), want the new CA's and the old one's", len(got), err)
	}
	if !bytes.Equal(running.CertPEM(), file) || !bytes.Equal(restarted.CertPEM(), file) {
		t.Fatalf("the bundles handed out differ from the directory's %s (running: %v, restarted: %v)", CACertFile,
			bytes.Equal(running.CertPEM(), file), bytes.Equal(restarted.CertPEM(), file))
	}
	if running.CertHash() != restarted.CertHash() {
		t.Fatalf("the running control plane's bundle hash %s, the restarted one's %s", running.CertHash(), restarted.CertHash())
	}
	certs, err := ParseCerts(file)
	if err != nil {
		t.Fatal(err)
	}
	if !certs[0].Equal(restarted.Certificate()) || !certs[0].NotBefore.After(certs[1].NotBefore) {
		t.Fatalf("%s holds %q first (valid from %v), want the new, signing CA, the newest", CACertFile, certs[0].Subject.CommonName, certs[0].NotBefore)
	}
	reversed := slices.Clone(certs)
	slices.Reverse(reversed)
	if CertsHash(reversed) != CertsHash(certs) || CertsHash(certs) != restarted.CertHash() {
		t.Fatal("CertsHash depends on the certificates' order")
	}

	// A client loaded from the rotated file takes the bundle in another
	// order as the one it has.
	client := filepath.Join(t.TempDir(), "bundle-ca-cert.pem")
	if err := os.WriteFile(client, file, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := LoadRoots(client)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := r.Use(reversed); err != nil || changed {
		t.Fatalf("Use of the same certificates in another order: changed %v, %v; want no change", changed, err)
	}
	if r.Hash() != restarted.CertHash() {
		t.Fatal("the client's hash is not the control plane's")
	}
}
