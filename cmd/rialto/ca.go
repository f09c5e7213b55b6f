package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/internal/pki"
)

func init() {
	register(&command{Name: "ca show", Summary: "Show the cluster CA of a TLS directory: its certificates, their expiry and fingerprints, and the revocation list.", Flags: caVerb(runCAShow, true)})
	register(&command{Name: "ca rotate", Summary: "Make a new CA key and certificate; the old certificate stays trusted until `rialto ca drop-old` (docs/operations.md, rotating the CA).", Flags: caVerb(runCARotate, false)})
	register(&command{Name: "ca drop-old", Summary: "Stop trusting the CA certificates a rotation kept.", Flags: caVerb(runCADropOld, false)})
}

// caDirFlag registers --tls-dir for the ca verbs.
func caDirFlag(fs *pflag.FlagSet, e *env) *string {
	def := e.getenv("RIALTO_TLS_DIR")
	if def == "" {
		def = "rialto-tls"
	}
	return fs.String("tls-dir", def, "the cluster CA's `directory` (rialto server --tls-dir; rialto up's STATE-DIR/tls) (env RIALTO_TLS_DIR)")
}

// caVerb defines --tls-dir (and -o, for fn with objects to print) and
// runs fn on the CA it names.
func caVerb(fn func(e *env, ca *pki.CA, o *output) error, objects bool) func(e *env, fs *pflag.FlagSet) runFunc {
	return func(e *env, fs *pflag.FlagSet) runFunc {
		dir := caDirFlag(fs, e)
		o := &output{}
		if objects {
			o = outputVar(fs)
		}
		return func(context.Context, []string) error {
			ca, err := pki.Load(*dir, pki.Options{})
			if err != nil {
				if errors.Is(err, pki.ErrNoCA) && !fs.Changed("tls-dir") && e.getenv("RIALTO_TLS_DIR") == "" {
					return fmt.Errorf("%w; name the CA's directory with --tls-dir or RIALTO_TLS_DIR (rialto server's --tls-dir; rialto up's STATE-DIR/tls)%s",
						err, caCertDirHint(e))
				}
				return err
			}
			return fn(e, ca, o)
		}
	}
}

// caCertOut is one CA certificate in ca show's -o output.
type caCertOut struct {
	ID       string    `json:"id"`    // SHA-256 fingerprint, hex
	State    string    `json:"state"` // signing, or kept (by a rotation)
	Subject  string    `json:"subject"`
	Expires  time.Time `json:"expires_at"`
	CertFile string    `json:"cert_file"`
}

func runCAShow(e *env, ca *pki.CA, o *output) error {
	certs, err := pki.ParseCerts(ca.CertPEM())
	if err != nil {
		return err
	}
	if o.structured() {
		out := make([]caCertOut, 0, len(certs))
		for i, c := range certs {
			sum := sha256.Sum256(c.Raw)
			state := "signing"
			if i > 0 {
				state = "kept"
			}
			out = append(out, caCertOut{ID: hex.EncodeToString(sum[:]), State: state, Subject: c.Subject.CommonName,
				Expires: c.NotAfter.UTC(), CertFile: ca.CertFile()})
		}
		return o.print(e.stdout, out)
	}
	now := time.Now()
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "ROLE\tSUBJECT\tEXPIRES\tSHA-256 FINGERPRINT")
	for i, c := range certs {
		role := "signing"
		if i > 0 {
			role = "kept by a rotation"
		}
		sum := sha256.Sum256(c.Raw)
		fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%s\n", role, c.Subject.CommonName, c.NotAfter.UTC().Format(time.DateOnly),
			until(now, c.NotAfter), hex.EncodeToString(sum[:]))
	}
	tw.Flush()
	fmt.Fprintf(e.stdout, "\nCertificate for clients: %s\n", ca.CertFile())
	return showCRL(e, ca, certs, now)
}

// maxCRLShown bounds the serial numbers ca show lists.
const maxCRLShown = 10

// showCRL prints the revocation list of ca's directory: its number (the
// same on every replica's copy once they agree), who signed it and the
// newest serial numbers it revokes.
func showCRL(e *env, ca *pki.CA, certs []*x509.Certificate, now time.Time) error {
	path := filepath.Join(ca.Dir(), pki.CRLFile)
	b := ca.CRLPEM()
	if len(b) == 0 {
		fmt.Fprintf(e.stdout, "Revocation list: none (no %s yet; the control plane writes it)\n", path)
		return nil
	}
	crl, err := pki.ParseCRL(b, certs)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	signer := "?"
	for _, c := range certs {
		if crl.CheckSignatureFrom(c) == nil {
			signer = c.Subject.CommonName
			break
		}
	}
	num := "0"
	if crl.Number != nil {
		num = crl.Number.String()
	}
	entries := slices.Clone(crl.RevokedCertificateEntries)
	fmt.Fprintf(e.stdout, "Revocation list: %s, number %s, signed by %s, updated %s (%s ago): ", path, num, signer,
		crl.ThisUpdate.UTC().Format(time.DateTime), now.Sub(crl.ThisUpdate).Truncate(time.Second))
	switch len(entries) {
	case 0:
		fmt.Fprintln(e.stdout, "no certificate revoked")
		return nil
	case 1:
		fmt.Fprintln(e.stdout, "1 certificate revoked")
	default:
		fmt.Fprintf(e.stdout, "%d certificates revoked\n", len(entries))
	}
	slices.SortFunc(entries, func(a, b x509.RevocationListEntry) int { return b.RevocationTime.Compare(a.RevocationTime) })
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "SERIAL\tREVOKED")
	for _, r := range entries[:min(len(entries), maxCRLShown)] {
		fmt.Fprintf(tw, "%s\t%s\n", r.SerialNumber.Text(16), r.RevocationTime.UTC().Format(time.DateTime))
	}
	tw.Flush()
	if n := len(entries) - maxCRLShown; n > 0 {
		fmt.Fprintf(e.stdout, "… and %d earlier (openssl crl -in %s -noout -text lists them all)\n", n, path)
	}
	return nil
}

func runCARotate(e *env, ca *pki.CA, _ *output) error {
	if err := ca.Rotate(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "New signing CA: %s. %s now holds it and the old one.\n", ca.Certificate().Subject.CommonName, ca.CertFile())
	fmt.Fprintln(e.stdout, "Next: give clients the new ca-cert.pem (it holds both), then restart the control plane so that it issues from the new CA; once every certificate the old CA issued has expired or been renewed, run `rialto ca drop-old` and restart again.")
	return nil
}

func runCADropOld(e *env, ca *pki.CA, _ *output) error {
	if err := ca.DropOld(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s now trusts only %s. Restart the control plane and give clients the new file.\n", ca.CertFile(), ca.Certificate().Subject.CommonName)
	return nil
}

// caCertDirHint names the directory of RIALTO_CACERT when it holds a CA's
// key too (rialto up's env sets RIALTO_CACERT, not RIALTO_TLS_DIR).
func caCertDirHint(e *env) string {
	cert := e.getenv("RIALTO_CACERT")
	if cert == "" {
		return ""
	}
	dir := filepath.Dir(cert)
	if _, err := os.Stat(filepath.Join(dir, pki.CAKeyFile)); err != nil {
		return ""
	}
	return fmt.Sprintf(": RIALTO_CACERT's is --tls-dir %s", dir)
}
