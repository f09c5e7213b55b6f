package pki

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"sync"
	"time"
)

// ServerConfig returns a TLS server configuration whose certificate the CA
// issues for commonName and hosts (its subject alternative names) with the
// given lifetime (0: DefaultLifetime). The certificate is renewed in memory
// when a third of its lifetime is left, or after a Rotate. Clients are
// asked for certificates as clientAuth says; those they present must chain
// to the CA and not be revoked: the CA certificates it trusts at the
// handshake (a process that follows a `rialto ca rotate` of its directory
// accepts the new CA's from then on, GetConfigForClient). TLS 1.2 is the
// minimum.
func (ca *CA) ServerConfig(commonName string, hosts []string, clientAuth tls.ClientAuthType, lifetime time.Duration) (*tls.Config, error) {
	get, err := ca.Renewing(Request{CommonName: commonName, Hosts: hosts, Usage: ServerAuth, Lifetime: lifetime})
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:       tls.VersionTLS12,
		Time:             ca.now,
		GetCertificate:   func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() },
		ClientAuth:       clientAuth,
		ClientCAs:        ca.Pool(),
		VerifyConnection: ca.VerifyPeer,
	}
	if clientAuth != tls.NoClientCert {
		// Once the CA trusts other certificates: the configuration as the
		// caller left it (cfg, changed after this returns), with the pool
		// of now. It has the NextProtos the caller set on cfg, not those
		// a server set on a copy of its own: a caller serving HTTP/2
		// names them on cfg (controlplane.APIServerTLS). (net/http's
		// ServeTLS adds h2 and http/1.1 to the configuration it is given
		// too, but that is its way, not its promise.)
		start := cfg.ClientCAs
		cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			pool := ca.Pool()
			if pool == start {
				return nil, nil
			}
			c := cfg.Clone()
			c.GetConfigForClient = nil
			c.ClientCAs = pool
			return c, nil
		}
	}
	return cfg, nil
}

// ClientConfig returns a TLS client configuration that trusts the CA (and
// checks the revocation list) and presents cert, if not nil. Set ServerName
// when the address dialled is not one the server's certificate names.
func (ca *CA) ClientConfig(cert *tls.Certificate) *tls.Config {
	c := &tls.Config{
		MinVersion:       tls.VersionTLS12,
		Time:             ca.now,
		RootCAs:          ca.Pool(),
		VerifyConnection: ca.VerifyPeer,
	}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

// Renewing returns a function that returns a certificate (with its key)
// the CA issues for r, issued again in memory when a third of its lifetime
// is left or after a Rotate; if issuing again fails, the current one is
// returned while it is valid. The key never leaves memory. It fails at
// once if the first certificate cannot be issued.
func (ca *CA) Renewing(r Request) (func() (*tls.Certificate, error), error) {
	rn := &renewer{ca: ca, req: r}
	if _, err := rn.get(); err != nil {
		return nil, err
	}
	return rn.get, nil
}

// renewer holds a certificate the CA issues and renews.
type renewer struct {
	ca  *CA
	req Request

	mu      sync.Mutex
	cert    *tls.Certificate
	renewAt time.Time
}

func (r *renewer) get() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.ca.now()
	if r.cert != nil && now.Before(r.renewAt) && bytes.Equal(r.cert.Leaf.RawIssuer, r.ca.Certificate().RawSubject) {
		return r.cert, nil
	}
	iss, err := r.ca.Issue(r.req)
	if err != nil {
		if r.cert != nil && now.Before(r.cert.Leaf.NotAfter) {
			return r.cert, nil // keep serving the still-valid one
		}
		return nil, fmt.Errorf("pki: renew certificate for %s: %w", r.req.CommonName, err)
	}
	c, err := iss.TLSCertificate()
	if err != nil {
		return nil, err
	}
	life := iss.Cert.NotAfter.Sub(now)
	r.cert, r.renewAt = &c, now.Add(life*2/3)
	return r.cert, nil
}
