package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"slices"
	"sync"
	"time"
)

// CRL is a revocation list that a process holding only the CA's
// certificates (a borrower, an agent) checks peers against: an X.509 CRL
// signed by one of those certificates, taken from PEM (Update, as the
// control plane hands it out) or from a file kept up to date by someone
// else (Watch, such as the ca-crl.pem beside ca-cert.pem that libnbd and
// qemu read too). A CRL whose signature does not verify is refused; an
// older one (lower CRL number) never replaces a newer one. The handshake
// checks a peer once (VerifyPeer); the connections registered with
// Tracker are ended when a later list revokes their peer, or when the CA
// certificates in use no longer hold their peer's CA (SetRoots), and a
// server checks each request of a connection made before with CheckConn
// (track.go).
//
// Zero value: not usable; use NewCRL. Methods are safe for concurrent use.
type CRL struct {
	mu      sync.Mutex
	roots   []*x509.Certificate
	path    string    // watched file ("" none)
	mod     time.Time // of the watched file when last read
	size    int64
	fileErr error // the watched file's last read error (fails checks closed)
	number  *big.Int
	pem     []byte
	revoked map[string]bool // hex serials; replaced, never changed, by each list taken
	gen     uint64          // counts the lists taken, for endRevoked

	live liveConns // the connections tracked (Tracker), track.go
}

// NewCRL returns an empty list whose updates must be signed by one of
// roots.
func NewCRL(roots []*x509.Certificate) *CRL {
	return &CRL{roots: roots, revoked: map[string]bool{}}
}

// ParseCRL parses a PEM X.509 CRL and checks that one of roots signed it.
func ParseCRL(b []byte, roots []*x509.Certificate) (*x509.RevocationList, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "X509 CRL" {
		return nil, errors.New("pki: no X509 CRL PEM block")
	}
	crl, err := x509.ParseRevocationList(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: CRL: %w", err)
	}
	for _, c := range roots {
		if crl.CheckSignatureFrom(c) == nil {
			return crl, nil
		}
	}
	return nil, errors.New("pki: the CRL is not signed by a trusted CA certificate")
}

// Update replaces the list with the PEM CRL b if it verifies and is newer
// than the one held (by CRL number); it reports whether it replaced it.
func (c *CRL) Update(b []byte) (bool, error) {
	defer c.endRevoked()
	c.mu.Lock()
	defer c.mu.Unlock()
	crl, err := ParseCRL(b, c.roots)
	if err != nil {
		return false, err
	}
	return c.setLocked(crl, b), nil
}

// SetRoots makes roots the certificates that must sign later updates (a
// CA bundle that replaced the one the list was made with, after a `rialto
// ca rotate`). The list held stays in force. When roots lacks one of the
// certificates before (`rialto ca drop-old`), the connections registered
// with the list's Tracker whose peer's certificate chains to none of
// roots are ended (track.go).
func (c *CRL) SetRoots(roots []*x509.Certificate) {
	if c.setRoots(roots) {
		c.endUntrusted()
	}
}

// setRoots is SetRoots without the ending of connections: it reports
// whether roots lack a certificate held before, for the caller to call
// endUntrusted once it holds no lock an end function might take.
func (c *CRL) setRoots(roots []*x509.Certificate) (dropped bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dropped = slices.ContainsFunc(c.roots, func(old *x509.Certificate) bool {
		return !slices.ContainsFunc(roots, old.Equal)
	})
	c.roots = roots
	return dropped
}

func (c *CRL) setLocked(crl *x509.RevocationList, b []byte) bool {
	num := crl.Number
	if num == nil {
		num = big.NewInt(0)
	}
	if c.number != nil && num.Cmp(c.number) <= 0 {
		return false
	}
	rev := make(map[string]bool, len(crl.RevokedCertificateEntries))
	for _, e := range crl.RevokedCertificateEntries {
		rev[e.SerialNumber.Text(16)] = true
	}
	c.number, c.pem, c.revoked = num, bytes.Clone(b), rev
	c.gen++
	return true
}

// Watch makes the list follow the file at path: it is read again, before
// a check, whenever its modification time or size changed. A missing file
// means no revocations; a file that cannot be read or does not verify
// makes every check fail until it is fixed (fail closed). Watch reads it
// once now and returns that error.
func (c *CRL) Watch(path string) error {
	defer c.endRevoked()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.path = path
	c.mod, c.size = time.Time{}, -1
	c.refreshLocked()
	return c.fileErr
}

func (c *CRL) refreshLocked() {
	if c.path == "" {
		return
	}
	st, err := os.Stat(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		c.fileErr = nil
		c.mod, c.size = time.Time{}, -1
		return
	}
	if err != nil {
		c.fileErr = fmt.Errorf("pki: %w", err)
		return
	}
	if st.ModTime().Equal(c.mod) && st.Size() == c.size {
		return
	}
	b, err := os.ReadFile(c.path)
	if err != nil {
		c.fileErr = fmt.Errorf("pki: %w", err)
		return
	}
	crl, err := ParseCRL(b, c.roots)
	if err != nil {
		c.fileErr = fmt.Errorf("%s: %w", c.path, err)
		return
	}
	c.fileErr = nil
	c.mod, c.size = st.ModTime(), st.Size()
	c.setLocked(crl, b)
}

// Number is the CRL number of the list held (nil: none yet).
func (c *CRL) Number() *big.Int {
	defer c.endRevoked()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshLocked()
	if c.number == nil {
		return nil
	}
	return new(big.Int).Set(c.number)
}

// PEM is the CRL held, as it was given (nil: none yet).
func (c *CRL) PEM() []byte {
	defer c.endRevoked()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshLocked()
	return c.pem
}

// Check refuses a revoked certificate (ErrRevoked).
func (c *CRL) Check(cert *x509.Certificate) error {
	defer c.endRevoked()
	return c.check(cert)
}

// check is Check, leaving the connections a list it took revokes to the
// caller's endRevoked.
func (c *CRL) check(cert *x509.Certificate) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshLocked()
	if c.fileErr != nil {
		return fmt.Errorf("pki: cannot check revocation: %w", c.fileErr)
	}
	if c.revoked[cert.SerialNumber.Text(16)] {
		return fmt.Errorf("%w: serial %s (%s)", ErrRevoked, cert.SerialNumber.Text(16), cert.Subject.CommonName)
	}
	return nil
}

// VerifyPeer is a tls.Config.VerifyConnection hook that refuses a peer
// whose certificate the list revokes.
func (c *CRL) VerifyPeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	return c.Check(cs.PeerCertificates[0])
}

// LoadClientTLS returns a TLS client configuration for a process that
// holds the cluster CA's certificate file (RIALTO_CACERT, --cacert): it
// trusts the certificates in caFile and, when a ca-crl.pem lies beside it
// (as in the CA's own directory, and in libnbd's and qemu's layout),
// refuses the server certificates that list revokes, reading it again
// when it changes. ServerName is left empty: the dialler sets it (the
// host dialled).
func LoadClientTLS(caFile string) (*tls.Config, error) {
	r, err := LoadRoots(caFile)
	if err != nil {
		return nil, err
	}
	return r.ClientTLS(), nil
}
