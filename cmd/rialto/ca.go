package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
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

// caCRLOut is the revocation list of the CA's directory in ca show's -o
// output: the last object, after the certificates.
type caCRLOut struct {
	ID       string         `json:"id"`    // revocation-list
	State    string         `json:"state"` // signed, or none (no ca-crl.pem yet)
	CRLFile  string         `json:"crl_file"`
	Number   *big.Int       `json:"number,omitempty"`
	Signer   string         `json:"signer,omitempty"`    // the subject of the CA certificate that signed it
	SignerID string         `json:"signer_id,omitempty"` // that certificate's id
	Updated  time.Time      `json:"updated_at,omitzero"`
	Revoked  int            `json:"revoked"` // how many certificates it revokes
	Newest   []caRevokedOut `json:"newest"`  // the newest revocations (at most maxCRLShown), newest first
}

// caRevokedOut is one certificate a revocation list revokes.
type caRevokedOut struct {
	Serial    string    `json:"serial"` // hex
	RevokedAt time.Time `json:"revoked_at"`
}

func runCAShow(e *env, ca *pki.CA, o *output) error {
	certs, err := pki.ParseCerts(ca.CertPEM())
	if err != nil {
		return err
	}
	if o.structured() {
		crl, err := readCRL(ca, certs)
		if err != nil {
			return err
		}
		out := make([]any, 0, len(certs)+1)
		for _, c := range certs {
			state := "signing"
			if !c.Equal(ca.Certificate()) {
				state = "kept"
			}
			out = append(out, caCertOut{ID: certID(c), State: state, Subject: c.Subject.CommonName,
				Expires: c.NotAfter.UTC(), CertFile: ca.CertFile()})
		}
		return o.print(e.stdout, append(out, crl))
	}
	now := time.Now()
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "ROLE\tSUBJECT\tEXPIRES\tSHA-256 FINGERPRINT")
	for _, c := range certs {
		role := "signing"
		if !c.Equal(ca.Certificate()) {
			role = "kept by a rotation"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%s\n", role, c.Subject.CommonName, c.NotAfter.UTC().Format(time.DateOnly),
			inSpan(now, c.NotAfter), certID(c))
	}
	tw.Flush()
	fmt.Fprintf(e.stdout, "\nCertificate for clients: %s\n", ca.CertFile())
	crl, err := readCRL(ca, certs)
	if err != nil {
		return err
	}
	showCRL(e, crl, now)
	return nil
}

// certID is a CA certificate's id in ca show: its SHA-256 fingerprint.
func certID(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// maxCRLShown bounds the serial numbers ca show lists.
const maxCRLShown = 10

// readCRL reads the revocation list of ca's directory, which one of
// certs must have signed, as ca show shows it: its number (the same on
// every replica's copy once they agree), who signed it and the newest
// serial numbers it revokes.
func readCRL(ca *pki.CA, certs []*x509.Certificate) (caCRLOut, error) {
	out := caCRLOut{ID: "revocation-list", State: "none", CRLFile: filepath.Join(ca.Dir(), pki.CRLFile), Newest: []caRevokedOut{}}
	b := ca.CRLPEM()
	if len(b) == 0 {
		return out, nil
	}
	crl, err := pki.ParseCRL(b, certs)
	if err != nil {
		return out, fmt.Errorf("%s: %w", out.CRLFile, err)
	}
	out.State, out.Signer, out.Number, out.Updated = "signed", "?", big.NewInt(0), crl.ThisUpdate.UTC()
	for _, c := range certs {
		if crl.CheckSignatureFrom(c) == nil {
			out.Signer, out.SignerID = c.Subject.CommonName, certID(c)
			break
		}
	}
	if crl.Number != nil {
		out.Number = crl.Number
	}
	entries := slices.Clone(crl.RevokedCertificateEntries)
	slices.SortFunc(entries, func(a, b x509.RevocationListEntry) int { return b.RevocationTime.Compare(a.RevocationTime) })
	out.Revoked = len(entries)
	for _, r := range entries[:min(len(entries), maxCRLShown)] {
		out.Newest = append(out.Newest, caRevokedOut{Serial: r.SerialNumber.Text(16), RevokedAt: r.RevocationTime.UTC()})
	}
	return out, nil
}

// showCRL prints the revocation list readCRL read.
func showCRL(e *env, crl caCRLOut, now time.Time) {
	if crl.State == "none" {
		fmt.Fprintf(e.stdout, "Revocation list: none (no %s yet; the control plane writes it)\n", crl.CRLFile)
		return
	}
	fmt.Fprintf(e.stdout, "Revocation list: %s, number %s, signed by %s, updated %s (%s ago): ", crl.CRLFile, crl.Number, crl.Signer,
		crl.Updated.Format(time.DateTime), span(now.Sub(crl.Updated)))
	switch crl.Revoked {
	case 0:
		fmt.Fprintln(e.stdout, "no certificate revoked")
		return
	case 1:
		fmt.Fprintln(e.stdout, "1 certificate revoked")
	default:
		fmt.Fprintf(e.stdout, "%d certificates revoked\n", crl.Revoked)
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "SERIAL\tREVOKED")
	for _, r := range crl.Newest {
		fmt.Fprintf(tw, "%s\t%s\n", r.Serial, r.RevokedAt.Format(time.DateTime))
	}
	tw.Flush()
	if n := crl.Revoked - len(crl.Newest); n > 0 {
		fmt.Fprintf(e.stdout, "… and %d earlier (openssl crl -in %s -noout -text lists them all)\n", n, crl.CRLFile)
	}
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
