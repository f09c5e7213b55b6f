package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"log/slog"
	"strings"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// caFollower keeps the CA certificates a long-running borrower (rialto
// attach, the supervisor of rialto vm run) verifies the control plane and the lenders' data planes with
// (cf.roots, see followRoots) current across a `rialto ca rotate`, as an
// agent does with its heartbeats' answers: it asks the control plane for
// its CA certificates (GET /v1/ca-certificates) over the API connection,
// which it verified with the certificates it holds, and uses them from
// then on. An operator's new --cacert file wins over them. Nothing a
// lender says changes them.
type caFollower struct {
	roots *pki.Roots
	c     *api.Client
	log   *slog.Logger
	// https: every address of the control plane is https://, so that an
	// answer comes over TLS the certificates held verified; over plain
	// HTTP (--insecure-http) anyone on the path could answer.
	https bool
	// refused is the hash of the bundle the control plane's last answer
	// carried and Use refused, warned about once; fileErr the --cacert
	// file's last error, likewise.
	refused, fileErr string
}

// caFollower is the follower of the verb's CA certificates (followRoots)
// through c; nil when they do not follow (no --cacert).
func (cf *clientFlags) caFollower(c *api.Client, log *slog.Logger) *caFollower {
	if cf.roots == nil || c == nil {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	addr := cf.addr
	if !strings.Contains(addr, "://") {
		addr = "https://" + addr // as client does
	}
	https := true
	for _, a := range strings.Split(addr, ",") {
		if a = strings.TrimSpace(a); a != "" && !strings.HasPrefix(a, "https://") {
			https = false
		}
	}
	return &caFollower{roots: cf.roots, c: c, log: log, https: https}
}

// check takes the --cacert file's certificates if an operator replaced
// them, then the control plane's if they are others than those in use;
// it reports whether those in use changed.
func (f *caFollower) check(ctx context.Context) bool {
	changed, err := f.roots.Reload()
	fileErr := ""
	if err != nil {
		fileErr = err.Error()
	}
	if fileErr != "" && fileErr != f.fileErr {
		f.log.Warn("the --cacert file is unusable; keeping the CA certificates in use", "file", f.roots.File(), "err", err)
	}
	f.fileErr = fileErr
	if changed {
		f.log.Info("the --cacert file changed: verifying with its CA certificates", "file", f.roots.File(), "cas", caNames(f.roots.Certs()))
	}
	if !f.https {
		return changed
	}
	got, err := f.c.CACertificates(ctx, f.roots.Hash(), 0)
	if err != nil {
		// A control plane without a cluster CA, or one that predates the
		// route, answers 404; one unreachable is the lease watch's to say.
		f.log.Debug("asking the control plane for its CA certificates", "err", err)
		return changed
	}
	if got.CACertificate == "" {
		return changed
	}
	certs, err := pki.ParseCerts([]byte(got.CACertificate))
	var took bool
	if err == nil {
		took, err = f.roots.Use(certs)
	}
	if err != nil {
		if got.CAHash != f.refused {
			f.refused = got.CAHash
			f.log.Warn("the control plane's CA certificates are refused; keeping those in use", "err", err)
		}
		return changed
	}
	if took {
		f.log.Info("CA certificates updated by the control plane", "cas", caNames(certs), "hash", f.roots.Hash())
	}
	return changed || took
}

// fingerprints are the fingerprints of the CA certificates in use (as
// `rialto ca show` prints them), for a record of what a long-running verb
// verifies with: attach's state file, a VM's record.
func (f *caFollower) fingerprints() []string { return fingerprints(f.roots.Certs()) }

// caFingerprints are the fingerprints of the CA certificates in use, for
// an attachment's state (attachState.CACertificates); nil when they do
// not follow (followRoots).
func (cf *clientFlags) caFingerprints() []string {
	if cf.roots == nil {
		return nil
	}
	return fingerprints(cf.roots.Certs())
}

// caNames are the common names of certs, for logs.
func caNames(certs []*x509.Certificate) []string {
	names := make([]string, len(certs))
	for i, c := range certs {
		names[i] = c.Subject.CommonName
	}
	return names
}

// fingerprints are the SHA-256 fingerprints of certs, in hex, as `rialto
// ca show` prints them.
func fingerprints(certs []*x509.Certificate) []string {
	out := make([]string, len(certs))
	for i, c := range certs {
		sum := sha256.Sum256(c.Raw)
		out[i] = hex.EncodeToString(sum[:])
	}
	return out
}
