package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
	var certs []caCertOut // and the revocation list, last
	if s := ca("show", "-o", "json"); json.Unmarshal([]byte(s), &certs) != nil || len(certs) != 3 ||
		certs[0].State != "signing" || certs[1].State != "kept" || len(certs[0].ID) != 64 || certs[2].ID != "revocation-list" {
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
// replicas on several hosts hold; so does `-o json`, for a script. It
// showed only the CA certificates; then -o json still did.
func TestCAShowRevocationList(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	ca, err := pki.Open(dir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	show := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
		if code := run(context.Background(), append([]string{"ca", "show", "--tls-dir", dir}, args...), e); code != 0 {
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
	// -o json: the same, as the last object.
	js := show("-o", "json")
	var objs []json.RawMessage
	if err := json.Unmarshal([]byte(js), &objs); err != nil || len(objs) != 2 {
		t.Fatalf("show -o json: %v, want the certificate and the revocation list:\n%s", err, js)
	}
	var cert caCertOut
	var crl struct { // the fields docs/operations.md names
		ID       string      `json:"id"`
		State    string      `json:"state"`
		CRLFile  string      `json:"crl_file"`
		Number   json.Number `json:"number"`
		Signer   string      `json:"signer"`
		SignerID string      `json:"signer_id"`
		Updated  time.Time   `json:"updated_at"`
		Revoked  int         `json:"revoked"`
		Newest   []struct {
			Serial    string    `json:"serial"`
			RevokedAt time.Time `json:"revoked_at"`
		} `json:"newest"`
	}
	if err := errors.Join(json.Unmarshal(objs[0], &cert), json.Unmarshal(objs[1], &crl)); err != nil {
		t.Fatal(err)
	}
	if crl.ID != "revocation-list" || crl.State != "signed" || crl.CRLFile != crlFile || crl.Number.String() != ca.CRLNumber().String() ||
		crl.Signer != ca.Certificate().Subject.CommonName || crl.SignerID != cert.ID || crl.Revoked != 2 || crl.Updated.IsZero() {
		t.Errorf("show -o json, the revocation list:\n%s", objs[1])
	}
	var newest []string
	for _, r := range crl.Newest {
		if r.RevokedAt.IsZero() {
			t.Errorf("show -o json: %s revoked at no time", r.Serial)
		}
		newest = append(newest, r.Serial)
	}
	if slices.Sort(serials); !slices.Equal(slices.Sorted(slices.Values(newest)), serials) {
		t.Errorf("show -o json names %v, want %v", newest, serials)
	}
}

// TestCAShowExpiryReadsPlainly: ca show says when a CA certificate
// expires in days, not as a Go duration ("2036-11-25 (87599h57m59s)").
func TestCAShowExpiryReadsPlainly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	ca, err := pki.Open(dir, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	if code := run(context.Background(), []string{"ca", "show", "--tls-dir", dir}, e); code != 0 {
		t.Fatalf("rialto ca show: exit %d\n%s", code, errb.String())
	}
	days := int((time.Until(ca.Certificate().NotAfter) + 12*time.Hour) / (24 * time.Hour))
	want := ca.Certificate().NotAfter.UTC().Format(time.DateOnly) + " (in " + strconv.Itoa(days) + " days)"
	if !strings.Contains(out.String(), want) {
		t.Errorf("ca show lacks %q:\n%s", want, out.String())
	}
	if !regexp.MustCompile(`updated [-0-9: ]+ \(\d+ seconds? ago\)`).MatchString(out.String()) {
		t.Errorf("ca show's revocation list's age:\n%s", out.String())
	}
}

func TestSpan(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{87599*time.Hour + 57*time.Minute + 59*time.Second, "in 3650 days"},
		{49 * time.Hour, "in 2 days"},
		{47 * time.Hour, "in 47 hours"},
		{90 * time.Minute, "in 90 minutes"},
		{61 * time.Second, "in 61 seconds"},
		{time.Second, "in 1 second"},
		{0, "in 0 seconds"},
		{-72 * time.Hour, "expired 3 days ago"},
	} {
		if got := inSpan(now, now.Add(tc.d)); got != tc.want {
			t.Errorf("inSpan(%v) = %q; want %q", tc.d, got, tc.want)
		}
	}
}
