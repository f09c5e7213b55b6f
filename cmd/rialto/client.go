package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/pki"
)

const defaultAddr = "https://127.0.0.1:7070"

// clientFlags are the flags every CLI verb shares.
type clientFlags struct {
	addr, token, caCert string
	tokenS              *secret // --token-file, --token @FILE, RIALTO_TOKEN
	out                 *output
	// roots, once followRoots made them, are the CA certificates of
	// --cacert as they change while the verb runs: client and dataTLS
	// verify with those in use at each dial.
	roots *pki.Roots
}

// addrFlag defines --addr, the control plane's URL (env RIALTO_ADDR),
// on every client verb and on the agent and appliance.
func addrFlag(fs *pflag.FlagSet, e *env, p *string) {
	addr := e.getenv("RIALTO_ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	fs.StringVar(p, "addr", addr, "control plane `URL` (env RIALTO_ADDR)")
}

func (cf *clientFlags) register(fs *pflag.FlagSet, e *env) {
	addrFlag(fs, e, &cf.addr)
	fs.StringVar(&cf.caCert, "cacert", e.getenv("RIALTO_CACERT"), "the cluster CA's certificate `file` (ca-cert.pem) to verify the control plane against (env RIALTO_CACERT; default: the system's CAs)")
	cf.tokenS = secretFile(fs, e, "token", "RIALTO_TOKEN", "the API token")
	cf.out = outputVar(fs)
}

func (cf *clientFlags) client() (*api.Client, error) {
	addr := cf.addr
	if !strings.Contains(addr, "://") {
		addr = "https://" + addr
	}
	if err := cf.resolveToken(); err != nil {
		return nil, err
	}
	if cf.roots != nil {
		return api.NewClient(addr, cf.token, &http.Client{Timeout: 2 * time.Minute, Transport: &rootsTransport{roots: cf.roots}}), nil
	}
	hc, err := api.HTTPClient(cf.caCert, 2*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("%w (--cacert, RIALTO_CACERT)", err)
	}
	if tr, ok := hc.Transport.(*http.Transport); ok && cf.caCert != "" && tr.TLSClientConfig != nil {
		tr.TLSClientConfig.VerifyConnection = controlPlaneOnly
	}
	return api.NewClient(addr, cf.token, hc), nil
}

// controlPlaneOnly is the VerifyConnection of the CLI's API client with
// the cluster CA (crypto/tls has checked the chain and the host name):
// the certificate must be a control plane's. The cluster CA also issues
// nodes' certificates, for the hosts their joins declare, which may be
// the control plane's: one of those at the API's address is not the
// control plane, and gets no token.
func controlPlaneOnly(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the server presented no certificate")
	}
	if cn := cs.PeerCertificates[0].Subject.CommonName; cn != controlplane.APIServerCN {
		return fmt.Errorf("the server at %s presents a certificate of the cluster CA for %q: not a control plane's", cs.ServerName, cn)
	}
	return nil
}

// json reports whether objects are printed as data (-o json, yaml or
// template) rather than tables.
func (cf *clientFlags) json() bool { return cf.out.structured() }

// print writes v as -o asks (json, yaml, template).
func (cf *clientFlags) print(w io.Writer, v any) error { return cf.out.print(w, v) }

// resolveToken sets cf.token from --token-file or RIALTO_TOKEN (after the
// flags are parsed); --token is refused.
func (cf *clientFlags) resolveToken() error {
	if cf.tokenS == nil {
		return nil
	}
	tok, err := cf.tokenS.get()
	if err != nil {
		return err
	}
	cf.token, cf.tokenS = tok, nil
	return nil
}

// dataTLS is the client configuration for the data planes of leases that
// require TLS (nbds://, rialto-mems://, rialto-accels://, rialto-nics://):
// the cluster CA of --cacert (RIALTO_CACERT), and the revocation list
// beside it (ca-crl.pem) if there is one; without --cacert, the system's
// CAs (a NIC lease's lenders are refused then: borrower.AttachNIC).
func (cf *clientFlags) dataTLS() (*tls.Config, error) {
	if cf.caCert == "" {
		return nil, nil
	}
	if cf.roots != nil {
		return cf.roots.ClientTLS(), nil
	}
	cfg, err := pki.LoadClientTLS(cf.caCert)
	if err != nil {
		return nil, fmt.Errorf("%w (--cacert, RIALTO_CACERT)", err)
	}
	return cfg, nil
}

// followRoots makes the verb verify the control plane (client) and the
// data planes (dataTLS, dataTLSFunc) with the CA certificates of --cacert
// as they change while it runs (pki.Roots: followCA changes them), rather
// than with those the file held at its start: a long-running borrower
// (rialto attach). Without --cacert it does nothing.
func (cf *clientFlags) followRoots() error {
	if cf.caCert == "" || cf.roots != nil {
		return nil
	}
	r, err := pki.LoadRoots(cf.caCert)
	if err != nil {
		return fmt.Errorf("%w (--cacert, RIALTO_CACERT)", err)
	}
	cf.roots = r
	return nil
}

// dataTLSFunc returns the client configuration for the data planes at
// each dial (see dataTLS): that of the CA certificates in use then, once
// followRoots made them; nil without --cacert.
func (cf *clientFlags) dataTLSFunc() (func() *tls.Config, error) {
	if cf.roots != nil {
		return cf.roots.ClientTLS, nil
	}
	cfg, err := cf.dataTLS()
	if err != nil {
		return nil, err
	}
	return borrower.StaticTLS(cfg), nil
}

// dataTrack is the function that registers the verb's TLS connections to
// the data planes with the revocation list it checks them with, once
// followRoots made it follow (pki.Roots.Tracker): a connection to a
// lender whose certificate a list taken later revokes (caFollower.check)
// is ended then, logged to log. nil without --cacert.
func (cf *clientFlags) dataTrack(log *slog.Logger) pki.TrackFunc {
	if cf.roots == nil {
		return nil
	}
	return cf.roots.Tracker(log)
}

// rootsTransport is the API client's transport once followRoots made the
// CA certificates follow: it verifies the control plane (a control
// plane's certificate: controlPlaneOnly) with those in use, and is made
// anew when they change. Connections made before keep the server they
// verified; the idle ones are closed, so that the next calls verify anew.
type rootsTransport struct {
	roots *pki.Roots

	mu   sync.Mutex
	pool *x509.CertPool // cur's
	cur  *http.Transport
}

func (t *rootsTransport) transport() *http.Transport {
	pool := t.roots.Pool()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur == nil || pool != t.pool {
		if t.cur != nil {
			t.cur.CloseIdleConnections()
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, VerifyConnection: controlPlaneOnly}
		t.cur, t.pool = tr, pool
	}
	return t.cur
}

func (t *rootsTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return t.transport().RoundTrip(r)
}

// CloseIdleConnections is what http.Client.CloseIdleConnections calls.
func (t *rootsTransport) CloseIdleConnections() { t.transport().CloseIdleConnections() }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// ago prints how long ago t was, for tables: "42s ago", "2h05m ago"
// (tableSpan).
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	if d := now.Sub(t); d >= 0 {
		return tableSpan(d) + " ago"
	}
	return "in " + tableSpan(t.Sub(now))
}

// until prints how far in the future t is, for tables: "59m58s",
// "2h05m", "3d4h" (tableSpan), or "expired".
func until(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	if d < 0 {
		return "expired"
	}
	return tableSpan(d)
}

// tableSpan is a duration as the tables print it, short and to the
// nearest of its last unit, two units at most: "42s", "59m58s" under an
// hour, "2h05m" under a day, "3d4h" beyond (not "76h0m0s", nor
// "59m58.123456s").
func tableSpan(d time.Duration) string {
	d = max(d, 0)
	if s := d.Round(time.Second); s < time.Minute {
		return fmt.Sprintf("%ds", s/time.Second)
	} else if s < time.Hour {
		return fmt.Sprintf("%dm%02ds", s/time.Minute, s%time.Minute/time.Second)
	}
	if m := d.Round(time.Minute); m < 24*time.Hour {
		return fmt.Sprintf("%dh%02dm", m/time.Hour, m%time.Hour/time.Minute)
	}
	h := d.Round(time.Hour)
	return fmt.Sprintf("%dd%dh", h/(24*time.Hour), h%(24*time.Hour)/time.Hour)
}

// span is a duration in the largest whole unit that reads plainly, to
// the nearest: "3650 days", "5 hours", "12 minutes", "1 second" (not
// "87599h57m59s").
func span(d time.Duration) string {
	d = max(d, 0)
	for _, u := range []struct {
		min, unit time.Duration
		name      string
	}{{48 * time.Hour, 24 * time.Hour, "day"}, {2 * time.Hour, time.Hour, "hour"}, {2 * time.Minute, time.Minute, "minute"}, {0, time.Second, "second"}} {
		if d >= u.min {
			n := (d + u.unit/2) / u.unit
			if n == 1 {
				return "1 " + u.name
			}
			return strconv.FormatInt(int64(n), 10) + " " + u.name + "s"
		}
	}
	return ""
}

// inSpan says when t is from now, plainly: "in 3650 days", "expired 2
// days ago".
func inSpan(now, t time.Time) string {
	if d := t.Sub(now); d >= 0 {
		return "in " + span(d)
	}
	return "expired " + span(now.Sub(t)) + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// activeLease fetches lease id and checks that it is an active lease of
// kind; verb names the command in the error ("memtest tests memory leases").
func activeLease(ctx context.Context, c *api.Client, id string, kind api.Kind, verb string) (api.Lease, error) {
	l, err := c.Lease(ctx, id)
	if err != nil {
		return l, err
	}
	if l.Kind != kind {
		return l, fmt.Errorf("lease %s is %s %s lease; %s", l.ID, l.Kind.Article(), l.Kind, verb)
	}
	if l.State != api.LeaseActive {
		return l, notActive(l)
	}
	return l, nil
}

// notActive is the error for a lease a data-plane verb cannot use: an
// ended lease never comes back, so it says what to do instead.
func notActive(l api.Lease) error {
	if l.State.Terminal() {
		return fmt.Errorf("lease %s is %s, not active, and ended leases cannot be used again: borrow another with `rialto lease create`", l.ID, l.State)
	}
	return fmt.Errorf("lease %s is %s, not active yet: try again once `rialto lease show %s` says active", l.ID, l.State, l.ID)
}
