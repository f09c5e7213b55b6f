package agent

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pki"
)

// The node's TLS key and certificate, and the CA certificates the
// control plane handed out, in the state dir.
const (
	nodeKeyFile  = "node-key.pem"  // 0600
	nodeCertFile = "node-cert.pem" // the certificate the control plane issued
	// caCertFile holds the CA certificates of the control plane's last
	// answer that changed them (0644), used at start instead of the
	// --cacert file's while that file holds what it held then (caBaseFile:
	// its pki.CertsHash). An operator's new --cacert file wins.
	caCertFile = "ca-cert.pem"
	caBaseFile = "ca-cert.base"
)

// trust is a set of CA certificates the agent verifies peers with.
type trust struct {
	certs []*x509.Certificate
	pool  *x509.CertPool
	hash  string // pki.CertsHash(certs)
}

func newTrust(certs []*x509.Certificate) *trust {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return &trust{certs: certs, pool: pool, hash: pki.CertsHash(certs)}
}

// nodeTLS is the agent's side of the cluster's TLS (Config.CAFile): the CA
// it trusts, its key, and the certificate the control plane signed for it.
type nodeTLS struct {
	caFile string
	base   string                // pki.CertsHash of caFile's certificates, at start
	roots  atomic.Pointer[trust] // the CA certificates in use: caFile's, or the control plane's since
	crl    *pki.CRL              // the revocation list, as the control plane hands it out
	key    crypto.Signer
	cert   atomic.Pointer[tls.Certificate] // nil until the first join
	log    *slog.Logger

	mu      sync.Mutex
	changed chan struct{}    // closed (and replaced) when the certificate changes
	clients []*swapTransport // the agent's client transports (control plane, peers)
}

// swapTransport is an http.RoundTripper whose transport is made anew, with
// the CA certificates of then, when they change (useCA).
type swapTransport struct {
	verify func(tls.ConnectionState) error
	cur    atomic.Pointer[http.Transport]
}

func (s *swapTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return s.cur.Load().RoundTrip(r)
}

// CloseIdleConnections is what http.Client.CloseIdleConnections calls.
func (s *swapTransport) CloseIdleConnections() { s.cur.Load().CloseIdleConnections() }

// certWait bounds how long a handshake of the agent's servers waits for
// a node certificate (the join's answer, on the first join or after the
// held one expired). It is shorter than the agent API's handshake
// deadline (ReadHeaderTimeout, 10 s). A caller still waiting after it
// has called an agent that is not joining.
const certWait = 5 * time.Second

// usable reports whether c can be presented: there is one, and it has
// not expired.
func usable(c *tls.Certificate) bool {
	return c != nil && time.Now().Before(c.Leaf.NotAfter)
}

// serving returns the certificate the agent's servers present. The
// control plane may call as soon as it has answered the join, before
// the agent has taken the certificate the answer brings: a handshake
// then waits for it (up to certWait, or until ctx ends) rather than fail
// with a TLS internal_error alert. An expired certificate (an agent
// restarted after its certificate's lifetime, joining again) is waited
// past the same way, and presented after certWait if none came (the
// peer's verification then says why it fails).
func (t *nodeTLS) serving(ctx context.Context) (*tls.Certificate, error) {
	var timer *time.Timer
	for {
		t.mu.Lock()
		c, changed := t.cert.Load(), t.changed
		t.mu.Unlock()
		if usable(c) {
			return c, nil
		}
		if timer == nil {
			timer = time.NewTimer(certWait)
			defer timer.Stop()
			t.log.Debug("a TLS handshake waits for the node certificate (the join's answer)")
		}
		select {
		case <-changed:
			continue
		case <-ctx.Done():
		case <-timer.C:
		}
		if c != nil {
			return c, nil
		}
		return nil, errors.New("agent: no node certificate yet (not joined)")
	}
}

// setupTLS loads the CA and the node's key (making one the first time)
// and certificate, if any.
func (a *Agent) setupTLS() error {
	if a.cfg.CAFile == "" {
		return nil
	}
	roots, err := pki.ReadCerts(a.cfg.CAFile)
	if err != nil {
		return fmt.Errorf("agent: CA certificate: %w", err)
	}
	base := pki.CertsHash(roots)
	if stored, err := a.storedCA(base); err != nil {
		a.log.Warn("the CA certificates the control plane handed out are set aside; using "+a.cfg.CAFile, "err", err)
	} else if stored != nil {
		roots = stored
	}
	t := &nodeTLS{caFile: a.cfg.CAFile, base: base, crl: pki.NewCRL(roots), log: a.log, changed: make(chan struct{})}
	t.roots.Store(newTrust(roots))
	if b, err := os.ReadFile(filepath.Join(a.cfg.StateDir, pki.CRLFile)); err == nil {
		if _, err := t.crl.Update(b); err != nil {
			a.log.Warn("the stored revocation list is unusable; the next heartbeat replaces it", "err", err)
		}
	}
	keyPath := filepath.Join(a.cfg.StateDir, nodeKeyFile)
	b, err := os.ReadFile(keyPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		key, keyPEM, err := pki.NewKey()
		if err != nil {
			return err
		}
		if err := writeFile(keyPath, keyPEM); err != nil {
			return err
		}
		t.key = key
	case err != nil:
		return fmt.Errorf("agent: node key: %w", err)
	default:
		// Whoever reads the key can present the node's certificate: serve
		// its leases' data planes to borrowers, heartbeat as it.
		if st, err := os.Stat(keyPath); err == nil && st.Mode().Perm()&0o077 != 0 {
			return fmt.Errorf("agent: %s holds the node's private key and other users may read it (mode %04o): chmod 600 %s", keyPath, st.Mode().Perm(), keyPath)
		}
		if t.key, err = pki.ParseKey(b); err != nil {
			return fmt.Errorf("agent: %s: %w", nodeKeyFile, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(a.cfg.StateDir, nodeCertFile)); err == nil {
		if err := t.checkStoredCert(b); err != nil {
			a.log.Warn("the stored node certificate is unusable; the next join replaces it", "err", err)
		} else if err := t.setCert(b); err != nil {
			a.log.Warn("the stored node certificate is unusable; the next join replaces it", "err", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("agent: node certificate: %w", err)
	}
	a.tls = t
	return nil
}

// storedCA returns the CA certificates a control plane handed out
// (caCertFile) if the --cacert file still holds what it held then (its
// hash is base); nil if there are none, or the file changed since (the
// operator's file wins).
func (a *Agent) storedCA(base string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(filepath.Join(a.cfg.StateDir, caBaseFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if string(bytes.TrimSpace(b)) != base {
		a.log.Info("the --cacert file changed since the control plane handed out CA certificates: using it", "file", a.cfg.CAFile)
		return nil, nil
	}
	certs, err := pki.ReadCerts(filepath.Join(a.cfg.StateDir, caCertFile))
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if err := pki.CheckCAs(certs); err != nil {
		return nil, fmt.Errorf("agent: %s: %w", caCertFile, err)
	}
	return certs, nil
}

// useCA takes the CA certificates of an answer of the control plane (a
// join's, a renewal's, a heartbeat's): the agent verifies the control
// plane, its peers and other lenders' data planes with them from then on
// (after a `rialto ca rotate`, the new CA's and the old one's, so that a
// control plane restarted with a certificate of the new CA is still
// trusted), and keeps them in the state dir. They came over a connection
// verified with the certificates in use, from a certificate of the
// control plane's (verifyControlPlane) that the revocation list does not
// name: only the control plane widens or narrows what the agent trusts.
func (a *Agent) useCA(caPEM string) {
	if a.tls == nil || caPEM == "" {
		return
	}
	certs, err := pki.ParseCerts([]byte(caPEM))
	if err == nil {
		err = pki.CheckCAs(certs)
	}
	if err != nil {
		a.log.Warn("the control plane's CA certificates are unusable", "err", err)
		return
	}
	cur := a.tls.roots.Load()
	tr := newTrust(certs)
	if tr.hash == cur.hash {
		return
	}
	// The file first: a restart takes what the agent verified with last.
	// The base after it, so that a crash between keeps the --cacert file.
	dir := a.cfg.StateDir
	err = writeFileMode(filepath.Join(dir, caCertFile), []byte(caPEM), 0o644)
	if err == nil {
		err = writeFileMode(filepath.Join(dir, caBaseFile), []byte(a.tls.base+"\n"), 0o644)
	}
	if err != nil {
		a.log.Warn("keeping the control plane's CA certificates", "err", err)
	}
	a.tls.setTrust(tr)
	names := make([]string, len(certs))
	for i, c := range certs {
		names[i] = c.Subject.CommonName
	}
	a.log.Info("CA certificates updated by the control plane", "cas", names, "hash", tr.hash)
}

// setTrust makes tr the CA certificates in use: the revocation list's
// signers, the servers' client CAs from the next handshake on, and the
// clients' transports made anew (pooled connections keep the server they
// verified).
func (t *nodeTLS) setTrust(tr *trust) {
	t.roots.Store(tr)
	t.crl.SetRoots(tr.certs)
	t.mu.Lock()
	clients := t.clients
	t.mu.Unlock()
	for _, c := range clients {
		old := c.cur.Swap(t.transport(c.verify))
		old.CloseIdleConnections()
	}
}

// caHash identifies the CA certificates in use (api.Heartbeat.CAHash).
func (a *Agent) caHash() string {
	if a.tls == nil {
		return ""
	}
	return a.tls.roots.Load().hash
}

// checkStoredCert refuses a stored node certificate, still valid, that
// no certificate of the CA file issued: one of a CA `rialto ca drop-old`
// dropped since, which the control plane refuses at the handshake, so
// that every join presenting it would fail while it is valid. Without
// it the join proves the node by its credential and brings a new one.
// An expired one is never presented (usable): it is kept as before.
func (t *nodeTLS) checkStoredCert(certPEM []byte) error {
	certs, err := pki.ParseCerts(certPEM)
	if err != nil {
		return err
	}
	leaf := certs[0]
	if !time.Now().Before(leaf.NotAfter) {
		return nil
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: t.roots.Load().pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("it was issued by %q, not by a CA of %s (dropped since?): %w", leaf.Issuer.CommonName, t.caFile, err)
	}
	return nil
}

// setCert makes certPEM, which must be for the node's key, the current
// certificate.
func (t *nodeTLS) setCert(certPEM []byte) error {
	certs, err := pki.ParseCerts(certPEM)
	if err != nil {
		return err
	}
	leaf := certs[0]
	pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(t.key.Public()) {
		return errors.New("the certificate is not for the node's key")
	}
	c := &tls.Certificate{PrivateKey: t.key, Leaf: leaf}
	for _, x := range certs {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	t.mu.Lock()
	t.cert.Store(c)
	close(t.changed)
	t.changed = make(chan struct{})
	clients := t.clients
	t.mu.Unlock()
	// Pooled connections carry the certificate (or none) they were made
	// with: the next calls must present this one.
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	return nil
}

// useCert checks a certificate the control plane sent and uses it.
func (a *Agent) useCert(certPEM string) error {
	certs, err := pki.ParseCerts([]byte(certPEM))
	if err != nil {
		return fmt.Errorf("agent: node certificate from the control plane: %w", err)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: a.tls.roots.Load().pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("agent: the node certificate does not verify against the CA certificates in use (%s, or the control plane's since): %w", a.tls.caFile, err)
	}
	if err := a.tls.setCert([]byte(certPEM)); err != nil {
		return fmt.Errorf("agent: node certificate from the control plane: %w", err)
	}
	return nil
}

// saveCert writes the certificate in use to the state dir.
func (a *Agent) saveCert(certPEM string) error {
	return writeFile(filepath.Join(a.cfg.StateDir, nodeCertFile), []byte(certPEM))
}

// useCRL takes a revocation list the control plane sent, if it verifies
// against the CA and is newer than the one held, and keeps it in the
// state dir (ca-crl.pem) for the next start.
func (a *Agent) useCRL(crlPEM string) {
	if a.tls == nil || crlPEM == "" {
		return
	}
	changed, err := a.tls.crl.Update([]byte(crlPEM))
	if err != nil {
		a.log.Warn("the control plane's revocation list is unusable", "err", err)
		return
	}
	if !changed {
		return
	}
	if err := writeFile(filepath.Join(a.cfg.StateDir, pki.CRLFile), []byte(crlPEM)); err != nil {
		a.log.Warn("keeping the revocation list", "err", err)
	}
	a.log.Info("revocation list updated", "crl_number", a.tls.crl.Number().String())
}

// crlNumber is the number of the revocation list held (0: none).
func (a *Agent) crlNumber() int64 {
	if a.tls == nil {
		return 0
	}
	if n := a.tls.crl.Number(); n != nil && n.IsInt64() {
		return n.Int64()
	}
	return 0
}

// csr is a CSR for the node's key naming host; the control plane names
// the node.
func (a *Agent) csr(host string) (string, error) {
	b, err := pki.CSR(a.tls.key, "", []string{host})
	return string(b), err
}

// serverTLS is the agent API's TLS configuration: the node certificate,
// and client certificates of the cluster CA asked for (the control
// plane's is required by the lease-execution routes, see requireCP).
// The client CAs are those in use at the handshake (useCA). The agent API
// (net/http's ServeTLS) speaks HTTP/2: the configuration of each
// handshake names it, as ServeTLS adds it to the first one only.
func (t *nodeTLS) serverTLS() *tls.Config {
	cfg := t.serverTLSWith(t.roots.Load().pool)
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return t.serverTLSWith(t.roots.Load().pool), nil
	}
	return cfg
}

func (t *nodeTLS) serverTLSWith(pool *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return t.serving(hello.Context())
		},
		ClientAuth:       tls.VerifyClientCertIfGiven,
		ClientCAs:        pool,
		VerifyConnection: t.crl.VerifyPeer,
		NextProtos:       []string{"h2", "http/1.1"},
	}
}

// dataServerTLS is the data planes' server configuration: the node
// certificate (it names the node's address and data-plane hosts), and no
// client certificate asked for: the lease credential, sent inside the
// session, authenticates the borrower.
func (t *nodeTLS) dataServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return t.serving(hello.Context())
		},
		ClientAuth: tls.NoClientCert,
	}
}

// dataClientTLS is the configuration for dialling data planes (a slot
// reading a block lease of another lender, a gateway dialling its slots):
// servers verify against the CA and are refused when the revocation list
// names them. The dialler sets ServerName. The CA certificates are those
// in use now (useCA): the drivers call it at each dial (TLSUser), and
// register each connection with the revocation list (crl.Tracker), which
// ends it when a later list revokes its server.
func (t *nodeTLS) dataClientTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: t.roots.Load().pool, VerifyConnection: t.crl.VerifyPeer}
}

// clientTLS verifies servers against the CA certificates in use, then
// with verify (after the chain and the host name), and presents the node
// certificate (once there is one).
func (t *nodeTLS) clientTLS(verify func(tls.ConnectionState) error) *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS12,
		RootCAs:          t.roots.Load().pool,
		VerifyConnection: verify,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			// An expired certificate (the agent was stopped, or missed
			// its renewal) would fail the handshake, the join's too, and
			// the agent would never get a new one: it presents none, the
			// control plane answers 401 and the agent joins again.
			if c := t.cert.Load(); usable(c) {
				return c, nil
			}
			return &tls.Certificate{}, nil // none yet: the join needs none
		},
	}
}

// agentIdleConnTimeout is how long the agent keeps an idle connection:
// longer than the heartbeat interval of a cluster of 10,000 nodes at the
// default cap (100 s).
const agentIdleConnTimeout = 15 * time.Minute

// verifyControlPlane is the VerifyConnection of the agent's client for the
// control plane: a certificate the revocation list does not name, and a
// control plane's (api.ControlPlaneServerCN). The cluster CA also issues
// nodes' certificates, for the hosts their joins declare, which may be
// the control plane's address: one of those presented there is not the
// control plane, and gets neither the bootstrap token nor the node's
// credential.
func (t *nodeTLS) verifyControlPlane(cs tls.ConnectionState) error {
	if err := t.crl.VerifyPeer(cs); err != nil {
		return err
	}
	return api.VerifyControlPlane(cs)
}

// cpClient is the agent's client for the control plane (join, heartbeats,
// renewals): it accepts only a control plane's certificate.
func (t *nodeTLS) cpClient(timeout time.Duration) *http.Client {
	return t.httpClient(timeout, t.verifyControlPlane)
}

// peerClient is the agent's client for its peers' agent APIs (the link
// probes, which carry no credential): any certificate of the cluster CA
// the revocation list does not name (a peer presents its node's).
func (t *nodeTLS) peerClient(timeout time.Duration) *http.Client {
	return t.httpClient(timeout, t.crl.VerifyPeer)
}

// httpClient is a client of the agent's that verifies servers with verify
// (clientTLS), its transport made anew when the CA certificates change.
func (t *nodeTLS) httpClient(timeout time.Duration, verify func(tls.ConnectionState) error) *http.Client {
	st := &swapTransport{verify: verify}
	t.mu.Lock()
	st.cur.Store(t.transport(verify))
	t.clients = append(t.clients, st)
	t.mu.Unlock()
	return &http.Client{Timeout: timeout, Transport: st}
}

// transport is a transport of httpClient's, with the CA certificates in
// use.
func (t *nodeTLS) transport(verify func(tls.ConnectionState) error) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = t.clientTLS(verify)
	// Keep the connection to the control plane across heartbeats: in a
	// big cluster the interval stretches past the default 90 s (heartbeat
	// spreading, docs/operations.md), and a new mutual-TLS handshake per
	// heartbeat would cost several times the heartbeat itself.
	tr.IdleConnTimeout = agentIdleConnTimeout
	return tr
}

// requireCP refuses a lease-execution call that did not come over TLS
// from the control plane's certificate.
func (a *Agent) requireCP(r *http.Request) error {
	if a.tls == nil {
		return nil
	}
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		return errors.New("lease-execution calls need the control plane's certificate (mutual TLS)")
	}
	if cn := r.TLS.PeerCertificates[0].Subject.CommonName; cn != pki.ControlPlaneCN {
		return fmt.Errorf("the certificate of %q may not call the lease-execution API", cn)
	}
	return nil
}

// renewCert asks the control plane for a new certificate once a third of
// the current one's lifetime is left.
func (a *Agent) renewCert(ctx context.Context, nodeID, cred string) error {
	if a.tls == nil {
		return nil
	}
	c := a.tls.cert.Load()
	if c == nil {
		return nil
	}
	life := c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)
	if time.Until(c.Leaf.NotAfter) > life/3 {
		return nil
	}
	a.mu.Lock()
	host := a.host
	a.mu.Unlock()
	csr, err := a.csr(host)
	if err != nil {
		return err
	}
	resp, err := api.NewClient(a.cfg.ControlPlane, cred, a.hc).NodeCertificate(ctx, nodeID, api.NodeCertificateRequest{CSR: csr})
	if err != nil {
		return fmt.Errorf("agent: renew the node certificate: %w", err)
	}
	a.useCA(resp.CACertificate)
	if err := a.useCert(resp.Certificate); err != nil {
		return err
	}
	if err := a.saveCert(resp.Certificate); err != nil {
		return err
	}
	a.log.Info("node certificate renewed", "expires", a.tls.cert.Load().Leaf.NotAfter)
	return nil
}

// writeFile replaces path atomically with data, readable by the owner only.
func writeFile(path string, data []byte) error {
	return writeFileMode(path, data, 0o600)
}

// writeFileMode replaces path atomically with data, with mode perm.
func writeFileMode(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("agent: write %s: %w", filepath.Base(path), err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(perm)
	if err == nil {
		_, err = bytes.NewReader(data).WriteTo(tmp)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("agent: write %s: %w", filepath.Base(path), err)
	}
	return nil
}
