package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"log/slog"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// caFollower keeps the CA certificates a long-running borrower (rialto
// attach, the supervisor of rialto vm run) verifies the control plane and the lenders' data planes with
// (cf.roots, see followRoots) current across a `rialto ca rotate`, and the
// revocation list it refuses lenders with current across revocations (a
// `rialto node remove`), as an agent does with its heartbeats' answers:
// it asks the control plane for its CA certificates and, when newer than
// the one it holds, its revocation list (GET /v1/ca-certificates) over the
// API connection, which it verified with the certificates it holds, and
// uses them from then on. An operator's new --cacert file wins over the
// certificates (and over the control plane's answer it replaced, until
// the control plane answers another), and the list beside it
// (ca-crl.pem) over the control plane's when its number is higher; a list that no CA certificate in use
// signed, or older than the one held, is not taken. Nothing a lender says
// changes them.
type caFollower struct {
	roots *pki.Roots
	c     *api.Client
	log   *slog.Logger
	// https: every address of the control plane is https://, so that an
	// answer comes over TLS the certificates held verified; over plain
	// HTTP (--insecure-http) anyone on the path could answer.
	https bool
	// refused is the hash of the bundle the control plane's last answer
	// carried and Use refused, warned about once; refusedCRL the list
	// UseCRL refused, likewise; fileErr the --cacert file's last error.
	refused, refusedCRL, fileErr string
	// answered is the hash of the bundle the control plane's last answer
	// named; overridden the one it named when an operator's new --cacert
	// file replaced the certificates in use: the file wins over that
	// answer (a control plane not yet restarted after a `rialto ca
	// drop-old` still hands out the dropped CA) until the control plane
	// answers another.
	answered, overridden string
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

// followCA has f (nil: nothing) check every watch (0: never), from
// another goroutine, until the function it returns is called (which
// waits for it): a verb that holds a data-plane connection for as long
// as its task runs (rialto accel run) ends it once the list taken
// revokes its lender, as attach does at its watch.
func followCA(ctx context.Context, f *caFollower, watch time.Duration) (stop func()) {
	if f == nil || watch <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(watch)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f.check(ctx)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// check takes the --cacert file's certificates if an operator replaced
// them, then the control plane's if they are others than those in use,
// and its revocation list if it is newer than the one held; it reports
// whether the certificates in use or the list held changed.
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
		f.overridden = f.answered
	}
	// The list beside the --cacert file is read again if it changed
	// (pki.Roots): one naming a lender ends the connections to it, as
	// the control plane's does.
	held := f.crlNumber()
	if !f.https {
		return changed
	}
	got, err := f.c.CACertificates(ctx, f.roots.Hash(), held)
	if err != nil {
		// A control plane without a cluster CA, or one that predates the
		// route, answers 404; one unreachable is the lease watch's to say.
		f.log.Debug("asking the control plane for its CA certificates", "err", err)
		return changed
	}
	// The certificates first: a list signed by a rotation's new CA
	// verifies with them.
	took := f.useCerts(got)
	return f.useCRL(got.CRL) || changed || took
}

// useCerts takes the CA certificates of the control plane's answer got,
// if it carries some, and reports whether those in use changed.
func (f *caFollower) useCerts(got api.CACertificates) bool {
	f.answered = got.CAHash
	if got.CAHash != f.overridden {
		f.overridden = ""
	}
	if got.CACertificate == "" {
		return false
	}
	if f.overridden != "" {
		// The operator's file replaced this very answer: it wins.
		return false
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
		return false
	}
	if took {
		f.log.Info("CA certificates updated by the control plane", "cas", caNames(certs), "hash", f.roots.Hash())
	}
	return took
}

// useCRL takes the revocation list crlPEM of the control plane's answer
// ("": none, the one held is current) if a CA certificate in use signed
// it and it is newer than the one held, and reports whether it did.
func (f *caFollower) useCRL(crlPEM string) bool {
	if crlPEM == "" {
		return false
	}
	took, err := f.roots.UseCRL([]byte(crlPEM))
	if err != nil {
		if crlPEM != f.refusedCRL {
			f.refusedCRL = crlPEM
			f.log.Warn("the control plane's revocation list is refused; keeping the one held", "err", err)
		}
		return false
	}
	if took {
		f.log.Info("revocation list updated by the control plane: lenders whose certificates it names are refused, and connections to them ended", "crl_number", f.crlNumber())
	}
	return took
}

// crlNumber is the number of the revocation list held (0: none), for the
// control plane's answer to leave it out when it has no newer one, and
// for a record of what a long-running verb refuses lenders with.
func (f *caFollower) crlNumber() int64 { return crlNumberOf(f.roots) }

// crlNumberOf is the number of the revocation list r holds (0: none, or
// one past an int64, which the API's numbers are).
func crlNumberOf(r *pki.Roots) int64 {
	if n := r.CRLNumber(); n != nil && n.IsInt64() {
		return n.Int64()
	}
	return 0
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

// crlNumber is the number of the revocation list the verb refuses
// lenders with (0: none, or they do not follow: followRoots), for an
// attachment's state (attachState.CRLNumber).
func (cf *clientFlags) crlNumber() int64 {
	if cf.roots == nil {
		return 0
	}
	return crlNumberOf(cf.roots)
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
