package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/pki"
)

// TestCAVerbs: show, rotate and drop-old on a CA directory, in process.
func TestCAVerbs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	if _, err := pki.Open(dir, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	ca := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string {
			if k == "RIALTO_TLS_DIR" {
				return dir
			}
			return ""
		}}
		if code := run(context.Background(), append([]string{"ca"}, args...), e); code != 0 {
			t.Fatalf("rialto ca %v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		return out.String()
	}
	rows := func(show string) int { // the certificates' rows, above the revocation list
		table, _, _ := strings.Cut(show, "Certificate for clients")
		return strings.Count(table, "Rialto cluster CA ")
	}
	if s := ca("show"); rows(s) != 1 || !strings.Contains(s, "signing") || !strings.Contains(s, filepath.Join(dir, "ca-cert.pem")) {
		t.Fatalf("show:\n%s", s)
	}
	ca("rotate")
	if s := ca("show"); rows(s) != 2 || !strings.Contains(s, "kept by a rotation") {
		t.Fatalf("show after rotate:\n%s", s)
	}
	var certs []caCertOut
	if s := ca("show", "-o", "json"); json.Unmarshal([]byte(s), &certs) != nil || len(certs) != 2 ||
		certs[0].State != "signing" || certs[1].State != "kept" || len(certs[0].ID) != 64 {
		t.Fatalf("show -o json after rotate:\n%s", s)
	}
	ca("drop-old")
	if s := ca("show"); rows(s) != 1 || strings.Contains(s, "kept by a rotation") {
		t.Fatalf("show after drop-old:\n%s", s)
	}
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	if code := run(context.Background(), []string{"ca", "show", "--tls-dir", t.TempDir()}, e); code == 0 || !strings.Contains(errb.String(), "no CA") {
		t.Fatalf("show of an empty dir: exit %d\n%s", code, errb.String())
	}
}

// TestCAShowHintsTheDirectory: `rialto ca show` in a shell set up by
// rialto up's env (RIALTO_CACERT, no RIALTO_TLS_DIR) finds no CA in the
// default rialto-tls; the error says how to name the directory and
// names RIALTO_CACERT's, which holds the CA.
func TestCAShowHintsTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rialto-state", "tls")
	if _, err := pki.Open(dir, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // no rialto-tls here
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		if k == "RIALTO_CACERT" {
			return filepath.Join(dir, pki.CACertFile)
		}
		return ""
	}}
	code := run(context.Background(), []string{"ca", "show"}, e)
	if code == 0 {
		t.Fatalf("ca show with no rialto-tls: exit 0\n%s", out.String())
	}
	for _, w := range []string{"no CA in rialto-tls", "--tls-dir or RIALTO_TLS_DIR", "RIALTO_CACERT's is --tls-dir " + dir} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("error %q does not say %q", errb.String(), w)
		}
	}
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"ca", "show", "--tls-dir", dir}, e); code != 0 {
		t.Fatalf("ca show --tls-dir %s: exit %d\n%s", dir, code, errb.String())
	}
}

// TestCAShowRevocationList: `rialto ca show` shows the revocation list it
// says it shows (its number, who signed it, the certificates it revokes),
// so that an operator can compare the copies of the CA directory that
// replicas on several hosts hold. It showed only the CA certificates.
func TestCAShowRevocationList(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	ca, err := pki.Open(dir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	show := func() string {
		t.Helper()
		var out, errb bytes.Buffer
		e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
		if code := run(context.Background(), []string{"ca", "show", "--tls-dir", dir}, e); code != 0 {
			t.Fatalf("rialto ca show: exit %d\n%s%s", code, out.String(), errb.String())
		}
		return out.String()
	}
	crlFile := filepath.Join(dir, pki.CRLFile)
	if s := show(); !strings.Contains(s, "Revocation list: "+crlFile+", number ") || !strings.Contains(s, "no certificate revoked") {
		t.Fatalf("show of a new CA does not show its empty revocation list:\n%s", s)
	}
	var serials []string
	for _, cn := range []string{"node-a", "node-b"} {
		is, err := ca.Issue(pki.Request{CommonName: cn, Hosts: []string{"127.0.0.1"}, Usage: pki.ClientAuth | pki.ServerAuth})
		if err != nil {
			t.Fatal(err)
		}
		if err := ca.Revoke(is.Cert.SerialNumber); err != nil {
			t.Fatal(err)
		}
		serials = append(serials, is.Cert.SerialNumber.Text(16))
	}
	s := show()
	want := []string{
		"Revocation list: " + crlFile + ", number " + ca.CRLNumber().String() + ",",
		"signed by " + ca.Certificate().Subject.CommonName,
		"2 certificates revoked",
	}
	for _, w := range append(want, serials...) {
		if !strings.Contains(s, w) {
			t.Errorf("show does not say %q:\n%s", w, s)
		}
	}
}
