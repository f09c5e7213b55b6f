package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/internal/filelock"
)

// File names in a CA directory and in a certificate directory written by
// WriteFiles (the names libnbd, nbdkit and qemu look for).
const (
	CACertFile     = "ca-cert.pem"
	CAKeyFile      = "ca-key.pem"
	CRLFile        = "ca-crl.pem"
	ServerCertFile = "server-cert.pem"
	ServerKeyFile  = "server-key.pem"
	ClientCertFile = "client-cert.pem"
	ClientKeyFile  = "client-key.pem"
	lockFile       = ".lock"
)

const (
	// DefaultCALifetime is how long a new CA certificate is valid.
	DefaultCALifetime = 10 * 365 * 24 * time.Hour
	// DefaultLifetime is how long an issued certificate is valid when the
	// request names no lifetime: short, so that a stolen one expires soon;
	// holders renew before it ends.
	DefaultLifetime = 24 * time.Hour
	// crlLifetime is the NextUpdate horizon of ca-crl.pem; the CRL is
	// re-signed at every change and when half of it has passed at Open.
	crlLifetime = 90 * 24 * time.Hour
	// backdate is subtracted from NotBefore so that a peer whose clock is
	// slightly behind still accepts a fresh certificate (a tenth of a
	// shorter lifetime).
	backdate = 5 * time.Minute
)

var (
	// ErrNoCA means the directory holds no CA (Load) or holds a CA
	// certificate without its key.
	ErrNoCA = errors.New("pki: no CA")
	// ErrRevoked is returned by CA.VerifyPeer for a revoked certificate.
	ErrRevoked = errors.New("pki: certificate revoked")
	// ErrUntrusted is a certificate that no longer chains to a CA
	// certificate in use: its CA was dropped (`rialto ca drop-old`) since
	// a handshake verified it (CRL.SetRoots, CRL.CheckConn).
	ErrUntrusted = errors.New("pki: certificate no longer trusted: its CA was dropped")
	// ErrBadRequest is a certificate request or CSR that cannot be signed.
	ErrBadRequest = errors.New("pki: bad certificate request")
)

// Options configure Open and Load.
type Options struct {
	// Now tells the time (nil: time.Now); tests inject a clock.
	Now func() time.Time
	// CommonName of a new CA certificate (default "Rialto cluster CA");
	// a short tag of the key is appended, so that CA generations differ.
	CommonName string
	// Lifetime of a new CA certificate (default DefaultCALifetime).
	Lifetime time.Duration
}

// Usage says what an issued certificate may authenticate.
type Usage uint8

const (
	// ServerAuth certificates authenticate TLS servers (they need Hosts).
	ServerAuth Usage = 1 << iota
	// ClientAuth certificates authenticate TLS clients.
	ClientAuth
)

// Request describes a certificate to issue.
type Request struct {
	// CommonName names the holder (a node ID, "controlplane", a tenant).
	CommonName string
	// Hosts are the DNS names and IP addresses the certificate is valid
	// for (subject alternative names); a server certificate needs one.
	Hosts []string
	Usage Usage
	// Lifetime (default DefaultLifetime); capped at the CA's own expiry.
	Lifetime time.Duration
}

// Issued is an issued certificate.
type Issued struct {
	Cert    *x509.Certificate
	CertPEM []byte // the certificate alone
	KeyPEM  []byte // its private key; nil when signed from a CSR
}

// TLSCertificate returns the certificate and key for a tls.Config.
func (i *Issued) TLSCertificate() (tls.Certificate, error) {
	if i.KeyPEM == nil {
		return tls.Certificate{}, errors.New("pki: certificate signed from a CSR: its key is the requester's")
	}
	c, err := tls.X509KeyPair(i.CertPEM, i.KeyPEM)
	if err != nil {
		return c, fmt.Errorf("pki: %w", err)
	}
	c.Leaf = i.Cert
	return c, nil
}

// CA is a certificate authority kept in a directory.
type CA struct {
	dir  string
	now  func() time.Time
	opts Options

	mu      sync.RWMutex
	signer  *x509.Certificate
	key     *ecdsa.PrivateKey
	trusted []*x509.Certificate // signer first
	pool    *x509.CertPool
	revoked map[string]time.Time // hex serial → revocation time
	crlNum  *big.Int
	crlPEM  []byte
	// crlForeign: the list held was signed by a CA certificate a rotation
	// added since this process loaded the CA (followRotation); Adopt signs
	// it again with this process's key, which every client verifies.
	crlForeign bool
	crlAt      time.Time // ThisUpdate of the CRL on disk
}

// Open opens the CA in dir, creating the directory (0700) and a new CA
// when it holds none.
func Open(dir string, opts Options) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return open(dir, opts, true)
}

// Load opens the CA in dir, which must exist (ErrNoCA otherwise).
func Load(dir string, opts Options) (*CA, error) {
	return open(dir, opts, false)
}

func open(dir string, opts Options, create bool) (*CA, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CommonName == "" {
		opts.CommonName = "Rialto cluster CA"
	}
	if opts.Lifetime <= 0 {
		opts.Lifetime = DefaultCALifetime
	}
	ca := &CA{dir: dir, now: opts.Now, opts: opts}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%w in %s (not a directory)", ErrNoCA, dir)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	kst, kerr := os.Stat(filepath.Join(dir, CAKeyFile))
	_, cerr := os.Stat(filepath.Join(dir, CACertFile))
	switch {
	case kerr == nil && kst.Mode().Perm()&0o006 != 0:
		// A copy restored with the wrong mode: every user of the machine
		// could sign certificates the whole cluster trusts.
		key := filepath.Join(dir, CAKeyFile)
		return nil, fmt.Errorf("pki: %s is the CA's private key but every user of the machine may read or write it (mode %04o): chmod 600 %s", key, kst.Mode().Perm(), key)
	case kerr == nil:
	case !errors.Is(kerr, fs.ErrNotExist):
		return nil, fmt.Errorf("pki: %w", kerr)
	case cerr == nil:
		return nil, fmt.Errorf("%w: %s has %s but no %s", ErrNoCA, dir, CACertFile, CAKeyFile)
	case !create:
		return nil, fmt.Errorf("%w in %s", ErrNoCA, dir)
	default:
		if err := ca.create(); err != nil {
			return nil, err
		}
		return ca, nil
	}
	if err := ca.load(); err != nil {
		return nil, err
	}
	// Keep the CRL fresh for third-party readers.
	if ca.now().Sub(ca.crlAt) > crlLifetime/2 {
		if err := ca.writeCRL(); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// lockDir takes an exclusive advisory lock on dir/.lock.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("pki: lock %s: %w", dir, err)
	}
	return func() { _ = filelock.Close(f) }, nil
}

// newCACert makes a CA key and self-signed certificate, valid from later
// than every certificate of olds (a rotation's new CA is the newest of
// the bundle, first in SortCerts's order as in ca-cert.pem, even when made
// within the second of the one before: certificates count whole
// seconds), but never from later than now.
func (ca *CA) newCACert(olds []*x509.Certificate) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	ski, err := keyID(&key.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	now := ca.now()
	notBefore := now.Add(-backdate).Truncate(time.Second)
	for _, c := range olds {
		if !notBefore.After(c.NotBefore) {
			notBefore = c.NotBefore.Add(time.Second)
		}
	}
	if notBefore.After(now) {
		notBefore = now
	}
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(),
		Subject:               pkix.Name{Organization: []string{"Rialto"}, CommonName: ca.opts.CommonName + " " + hex.EncodeToString(ski[:4])},
		NotBefore:             notBefore,
		NotAfter:              now.Add(ca.opts.Lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          ski,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	return cert, key, nil
}

func (ca *CA) create() error {
	cert, key, err := ca.newCACert(nil)
	if err != nil {
		return err
	}
	ca.signer, ca.key, ca.trusted = cert, key, []*x509.Certificate{cert}
	ca.revoked = map[string]time.Time{}
	ca.crlNum = big.NewInt(0)
	ca.rebuildPool()
	if err := ca.writeKey(); err != nil {
		return err
	}
	if err := ca.writeCerts(); err != nil {
		return err
	}
	return ca.writeCRL()
}

func (ca *CA) load() error {
	certs, err := ReadCerts(filepath.Join(ca.dir, CACertFile))
	if err != nil {
		return err
	}
	kb, err := os.ReadFile(filepath.Join(ca.dir, CAKeyFile))
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	k, err := parseKey(kb)
	if err != nil {
		return fmt.Errorf("pki: %s: %w", CAKeyFile, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return fmt.Errorf("pki: %s: not an ECDSA key", CAKeyFile)
	}
	// The signing certificate is the key's, wherever it is in the file
	// (SortCerts puts the newest first; one written before had it
	// first).
	i := slices.IndexFunc(certs, func(c *x509.Certificate) bool {
		pub, ok := c.PublicKey.(*ecdsa.PublicKey)
		return ok && pub.Equal(&key.PublicKey)
	})
	if i < 0 {
		return fmt.Errorf("pki: %s does not match any certificate of %s", CAKeyFile, CACertFile)
	}
	signer := certs[i]
	if !signer.IsCA {
		return fmt.Errorf("pki: the certificate of %s's key in %s is not a CA", CAKeyFile, CACertFile)
	}
	trusted := append([]*x509.Certificate{signer}, slices.Delete(slices.Clone(certs), i, i+1)...)
	ca.signer, ca.key, ca.trusted = signer, key, trusted
	ca.rebuildPool()
	return ca.loadCRL()
}

// loadCRL reads ca-crl.pem (absent: an empty list) and checks that one of
// the trusted CA certificates signed it. A list it cannot read (not
// signed by a trusted CA certificate, cut short) is an error, and the
// list held before stays in force: what it revoked is still refused.
func (ca *CA) loadCRL() error {
	b, err := os.ReadFile(filepath.Join(ca.dir, CRLFile))
	if errors.Is(err, fs.ErrNotExist) {
		ca.revoked, ca.crlNum = map[string]time.Time{}, big.NewInt(0)
		return nil
	}
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "X509 CRL" {
		return fmt.Errorf("pki: %s: no X509 CRL block", CRLFile)
	}
	crl, err := x509.ParseRevocationList(blk.Bytes)
	if err != nil {
		return fmt.Errorf("pki: %s: %w", CRLFile, err)
	}
	signed := false
	for _, c := range ca.trusted {
		if crl.CheckSignatureFrom(c) == nil {
			signed = true
			break
		}
	}
	foreign := false
	if !signed {
		followed, another := ca.followRotation(crl)
		if !followed {
			names := make([]string, len(ca.trusted))
			for i, c := range ca.trusted {
				names[i] = c.Subject.CommonName
			}
			hint := ""
			if another {
				hint = fmt.Sprintf("; %s holds another CA than the one this process loaded: restart the process to load it (docs/operations.md, \"Rotating the CA\")", ca.dir)
			}
			return fmt.Errorf("pki: %s is not signed by the CA: it is signed by %q, and this process trusts %s%s",
				CRLFile, crl.Issuer.CommonName, strings.Join(names, ", "), hint)
		}
		foreign = true
	}
	revoked := make(map[string]time.Time, len(crl.RevokedCertificateEntries))
	for _, e := range crl.RevokedCertificateEntries {
		revoked[e.SerialNumber.Text(16)] = e.RevocationTime
	}
	num := big.NewInt(0)
	if crl.Number != nil {
		num = crl.Number
	}
	ca.revoked, ca.crlNum, ca.crlPEM, ca.crlAt = revoked, num, b, crl.ThisUpdate
	ca.crlForeign = foreign
	return nil
}

// followRotation handles a list that no CA certificate this process
// trusts signed: when the directory's ca-cert.pem still holds this
// process's signing certificate (a `rialto ca rotate` by another process
// since this one loaded the CA keeps it) and one of its certificates
// signed crl, the process trusts what ca-cert.pem holds from then on, as
// it would after a restart, and reports followed. It still signs with its
// own key until it restarts (clients may not hold the new certificate
// yet). A directory that holds another CA (ca-cert.pem without this
// process's signing certificate) is not followed: another reports it. The
// caller holds ca.mu, or owns ca.
func (ca *CA) followRotation(crl *x509.RevocationList) (followed, another bool) {
	if ca.signer == nil {
		return false, false
	}
	certs, err := ReadCerts(filepath.Join(ca.dir, CACertFile))
	if err != nil {
		return false, false
	}
	if !slices.ContainsFunc(certs, ca.signer.Equal) {
		return false, true
	}
	trusted := []*x509.Certificate{ca.signer} // signer first, as ever
	signed := false
	for _, c := range certs {
		if !c.IsCA || c.Equal(ca.signer) {
			continue
		}
		trusted = append(trusted, c)
		signed = signed || crl.CheckSignatureFrom(c) == nil
	}
	if !signed {
		return false, false
	}
	ca.trusted = trusted
	ca.rebuildPool()
	return true, false
}

func (ca *CA) rebuildPool() {
	p := x509.NewCertPool()
	for _, c := range ca.trusted {
		p.AddCert(c)
	}
	ca.pool = p
}

func (ca *CA) writeKey() error {
	der, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return writeAtomic(filepath.Join(ca.dir, CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// writeCerts writes ca-cert.pem: the trusted CA certificates in their
// canonical order (SortCerts), as CertPEM hands them out.
func (ca *CA) writeCerts() error {
	var b bytes.Buffer
	for _, c := range SortCerts(ca.trusted) {
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return writeAtomic(filepath.Join(ca.dir, CACertFile), b.Bytes(), 0o644)
}

// writeCRL signs the current revocation list and writes it, numbered
// one more than the one it replaces.
func (ca *CA) writeCRL() error {
	return ca.writeCRLNumbered(new(big.Int).Add(ca.crlNum, big.NewInt(1)))
}

// writeCRLNumbered signs the current revocation list with number num and
// writes it.
func (ca *CA) writeCRLNumbered(num *big.Int) error {
	now := ca.now()
	tmpl := &x509.RevocationList{Number: num, ThisUpdate: now, NextUpdate: now.Add(crlLifetime)}
	for s, at := range ca.revoked {
		n, ok := new(big.Int).SetString(s, 16)
		if !ok {
			continue
		}
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: n, RevocationTime: at})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.signer, ca.key)
	if err != nil {
		return fmt.Errorf("pki: sign CRL: %w", err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
	if err := writeAtomic(filepath.Join(ca.dir, CRLFile), b, 0o644); err != nil {
		return err
	}
	ca.crlNum, ca.crlPEM, ca.crlAt, ca.crlForeign = num, b, now, false
	return nil
}

// writeAtomic writes data to a temporary file with mode perm and renames it
// over path, so that readers see the old or the new content, never a part.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	tmp := f.Name()
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	return nil
}

func newSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic("pki: crypto/rand: " + err.Error())
	}
	if n.Sign() == 0 {
		n.SetInt64(1)
	}
	return n
}

// keyID is the SHA-256 (truncated to 20 bytes) of the public key, used as
// subject key identifier.
func keyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	h := sha256.Sum256(der)
	return h[:20], nil
}

// Dir is the CA's directory.
func (ca *CA) Dir() string { return ca.dir }

// CertFile is the path of ca-cert.pem, what clients trust.
func (ca *CA) CertFile() string { return filepath.Join(ca.dir, CACertFile) }

// Certificate is the signing CA certificate.
func (ca *CA) Certificate() *x509.Certificate {
	ca.mu.RLock()
	defer ca.mu.RUnlock()
	return ca.signer
}

// CertPEM returns the trusted CA certificates, in their canonical order
// (SortCerts): the content of ca-cert.pem, whether this process loaded
// the directory so or followed a rotation of it since (it keeps its own
// signing certificate, the old CA's, but hands out the bundle a restarted
// process does).
func (ca *CA) CertPEM() []byte {
	ca.mu.RLock()
	defer ca.mu.RUnlock()
	var b bytes.Buffer
	for _, c := range SortCerts(ca.trusted) {
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// CertHash is CertsHash of the trusted CA certificates (CertPEM): a
// heartbeat reports the hash of the bundle its agent trusts, and the
// answer brings CertPEM when it differs.
func (ca *CA) CertHash() string {
	ca.mu.RLock()
	defer ca.mu.RUnlock()
	return CertsHash(ca.trusted)
}

// CertsHash identifies a CA bundle whatever the order of its
// certificates: the hex SHA-256 of their DER in their canonical order
// (SortCerts).
func CertsHash(certs []*x509.Certificate) string {
	h := sha256.New()
	for _, c := range SortCerts(certs) {
		h.Write(c.Raw)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SortCerts returns a CA bundle's certificates in their canonical order,
// the one every bundle is handed out and identified in (CA.CertPEM,
// CertsHash, Roots): the newest first (the latest NotBefore; between
// equals, the lesser DER), each certificate once. It is the order of
// ca-cert.pem (after `rialto ca rotate`, the new CA first), so that a
// bundle handed out is that file byte for byte (writeCerts writes it so).
// certs is left as it is.
func SortCerts(certs []*x509.Certificate) []*x509.Certificate {
	out := slices.Clone(certs)
	slices.SortStableFunc(out, func(a, b *x509.Certificate) int {
		if c := b.NotBefore.Compare(a.NotBefore); c != 0 {
			return c
		}
		return bytes.Compare(a.Raw, b.Raw)
	})
	return slices.CompactFunc(out, func(a, b *x509.Certificate) bool { return a.Equal(b) })
}

// Pool returns a pool of the trusted CA certificates.
func (ca *CA) Pool() *x509.CertPool {
	ca.mu.RLock()
	defer ca.mu.RUnlock()
	return ca.pool
}

// CRLPEM returns the current signed revocation list.
func (ca *CA) CRLPEM() []byte {
	ca.mu.RLock()
	defer ca.mu.RUnlock()
	return ca.crlPEM
}

// Issue makes a key pair and a certificate for it.
func (ca *CA) Issue(r Request) (*Issued, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	iss, err := ca.sign(&key.PublicKey, r)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	iss.KeyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	return iss, nil
}

// SignCSR signs a PEM certificate signing request. The identity comes from
// r, which the caller has authenticated, not from the CSR: the CSR proves
// possession of the key, and the names it asks for (if any) must be among
// r's, or the request is refused (see CheckCSR).
func (ca *CA) SignCSR(csrPEM []byte, r Request) (*Issued, error) {
	csr, err := CheckCSR(csrPEM, r)
	if err != nil {
		return nil, err
	}
	return ca.sign(csr.PublicKey, r)
}

// CheckCSR parses a PEM certificate signing request and checks what
// SignCSR would: a valid request r, the CSR's own signature (possession of
// the key), an acceptable key (ECDSA P-256 or P-384, Ed25519, RSA of at
// least 2048 bits), and names within r's (a common name that is empty or
// r.CommonName, hosts among r.Hosts, no URI or e-mail names).
func CheckCSR(csrPEM []byte, r Request) (*x509.CertificateRequest, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(csrPEM)
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: no CERTIFICATE REQUEST PEM block", ErrBadRequest)
	}
	csr, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: CSR signature: %v", ErrBadRequest, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("%w: ECDSA curve %s (want P-256 or P-384)", ErrBadRequest, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("%w: RSA key of %d bits (want at least 2048)", ErrBadRequest, k.N.BitLen())
		}
	default:
		return nil, fmt.Errorf("%w: unsupported key type %T", ErrBadRequest, csr.PublicKey)
	}
	if cn := csr.Subject.CommonName; cn != "" && cn != r.CommonName {
		return nil, fmt.Errorf("%w: CSR names %q, the requester is %q", ErrBadRequest, cn, r.CommonName)
	}
	allowed := map[string]bool{}
	for _, h := range r.Hosts {
		allowed[canonHost(h)] = true
	}
	for _, h := range csr.DNSNames {
		if !allowed[canonHost(h)] {
			return nil, fmt.Errorf("%w: CSR asks for host %q, not allowed for %q", ErrBadRequest, h, r.CommonName)
		}
	}
	for _, ip := range csr.IPAddresses {
		if !allowed[ip.String()] {
			return nil, fmt.Errorf("%w: CSR asks for address %s, not allowed for %q", ErrBadRequest, ip, r.CommonName)
		}
	}
	if len(csr.URIs) > 0 || len(csr.EmailAddresses) > 0 {
		return nil, fmt.Errorf("%w: CSR asks for URI or e-mail names", ErrBadRequest)
	}
	return csr, nil
}

func canonHost(h string) string {
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return strings.ToLower(h)
}

func (r *Request) check() error {
	if r.CommonName == "" {
		return fmt.Errorf("%w: no common name", ErrBadRequest)
	}
	if r.Usage == 0 || r.Usage&^(ServerAuth|ClientAuth) != 0 {
		return fmt.Errorf("%w: usage must be ServerAuth, ClientAuth or both", ErrBadRequest)
	}
	if r.Usage&ServerAuth != 0 && len(r.Hosts) == 0 {
		return fmt.Errorf("%w: a server certificate needs at least one host name or address", ErrBadRequest)
	}
	for _, h := range r.Hosts {
		if net.ParseIP(h) != nil {
			continue
		}
		if !validDNSName(h) {
			return fmt.Errorf("%w: bad host name %q", ErrBadRequest, h)
		}
	}
	if r.Lifetime < 0 {
		return fmt.Errorf("%w: negative lifetime", ErrBadRequest)
	}
	return nil
}

// validDNSName accepts host names and a leading wildcard label.
func validDNSName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for i, l := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if l == "*" && i == 0 {
			continue
		}
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// sign issues a certificate for pub as r describes.
func (ca *CA) sign(pub crypto.PublicKey, r Request) (*Issued, error) {
	ca.mu.RLock()
	signer, key := ca.signer, ca.key
	ca.mu.RUnlock()
	now := ca.now()
	life := r.Lifetime
	if life == 0 {
		life = DefaultLifetime
	}
	notAfter := now.Add(life)
	if notAfter.After(signer.NotAfter) {
		notAfter = signer.NotAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("pki: the CA certificate has expired (%s)", signer.NotAfter.UTC().Format(time.RFC3339))
	}
	ski, err := keyID(pub)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(),
		Subject:      pkix.Name{Organization: []string{"Rialto"}, CommonName: r.CommonName},
		NotBefore:    now.Add(-min(backdate, life/10)),
		NotAfter:     notAfter,
		// qemu's tls-creds-x509 insists on key encipherment when the key
		// usage extension is critical, as Go makes it; GnuTLS and Go
		// ignore the bit for ECDSA keys.
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		SubjectKeyId:          ski,
	}
	if r.Usage&ServerAuth != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if r.Usage&ClientAuth != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, h := range r.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, pub, key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if err := ca.record(cert); err != nil {
		return nil, err
	}
	return &Issued{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Revoke adds a certificate's serial number to the revocation list and
// writes the re-signed list. Revoking twice is not an error.
func (ca *CA) Revoke(serial *big.Int) error {
	if serial == nil || serial.Sign() <= 0 {
		return fmt.Errorf("%w: bad serial number", ErrBadRequest)
	}
	unlock, err := lockDir(ca.dir)
	if err != nil {
		return err
	}
	defer unlock()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	// Another process sharing the directory may have revoked others.
	if err := ca.loadCRL(); err != nil {
		return err
	}
	if _, ok := ca.revoked[serial.Text(16)]; ok {
		return nil
	}
	ca.revoked[serial.Text(16)] = ca.now().UTC().Truncate(time.Second)
	return ca.writeCRL()
}

// Revoked reports whether serial is on the revocation list.
func (ca *CA) Revoked(serial *big.Int) bool {
	if serial == nil {
		return false
	}
	ca.mu.RLock()
	defer ca.mu.RUnlock()
	_, ok := ca.revoked[serial.Text(16)]
	return ok
}

// Reload re-reads the revocation list, for a process sharing the directory
// with the one that revokes.
func (ca *CA) Reload() error {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.loadCRL()
}

// Verify checks that cert chains to a trusted CA certificate at the CA's
// current time, may be used for usage, and is not revoked.
func (ca *CA) Verify(cert *x509.Certificate, usage Usage) error {
	var eku []x509.ExtKeyUsage
	if usage&ServerAuth != 0 {
		eku = append(eku, x509.ExtKeyUsageServerAuth)
	}
	if usage&ClientAuth != 0 {
		eku = append(eku, x509.ExtKeyUsageClientAuth)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), CurrentTime: ca.now(), KeyUsages: eku}); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if ca.Revoked(cert.SerialNumber) {
		return fmt.Errorf("%w: serial %s (%s)", ErrRevoked, cert.SerialNumber.Text(16), cert.Subject.CommonName)
	}
	return nil
}

// VerifyPeer is a tls.Config.VerifyConnection hook that refuses a peer
// whose certificate is revoked (crypto/tls has checked the chain; it runs
// on resumed sessions too, unlike VerifyPeerCertificate).
func (ca *CA) VerifyPeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	leaf := cs.PeerCertificates[0]
	if ca.Revoked(leaf.SerialNumber) {
		return fmt.Errorf("%w: serial %s (%s)", ErrRevoked, leaf.SerialNumber.Text(16), leaf.Subject.CommonName)
	}
	return nil
}

// Rotate replaces the signing key and certificate. The old CA certificate
// stays trusted (in ca-cert.pem) until DropOld, so certificates it issued
// keep verifying while their holders renew them.
func (ca *CA) Rotate() error {
	unlock, err := lockDir(ca.dir)
	if err != nil {
		return err
	}
	defer unlock()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	cert, key, err := ca.newCACert(ca.trusted)
	if err != nil {
		return err
	}
	now := ca.now()
	trusted := []*x509.Certificate{cert}
	for _, c := range ca.trusted {
		if c.NotAfter.After(now) {
			trusted = append(trusted, c)
		}
	}
	if err := ca.loadCRL(); err != nil {
		return err
	}
	ca.signer, ca.key, ca.trusted = cert, key, trusted
	ca.rebuildPool()
	// Certificates first: a reader that sees the new key then finds its
	// certificate; one that sees only the new certificates still trusts
	// the old key's.
	if err := ca.writeCerts(); err != nil {
		return err
	}
	if err := ca.writeKey(); err != nil {
		return err
	}
	return ca.writeCRL()
}

// DropOld stops trusting the CA certificates that Rotate kept. The
// revocation list is signed anew with the signing key: a control plane
// that ran on the old key after the rotation may have signed it with
// that key, which the directory no longer trusts.
func (ca *CA) DropOld() error {
	unlock, err := lockDir(ca.dir)
	if err != nil {
		return err
	}
	defer unlock()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if err := ca.loadCRL(); err != nil { // what others revoked since
		return err
	}
	// The list first: a reader that still trusts the old certificate
	// takes one signed with the new key too.
	if err := ca.writeCRL(); err != nil {
		return err
	}
	ca.trusted = []*x509.Certificate{ca.signer}
	ca.rebuildPool()
	return ca.writeCerts()
}

// ReadCerts reads every certificate of a PEM file.
func ReadCerts(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	certs, err := ParseCerts(b)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	return certs, nil
}

// ParseCerts parses every CERTIFICATE block of PEM data; there must be one.
func ParseCerts(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs, nil
}

// LoadPool reads a PEM file of CA certificates (such as ca-cert.pem) into a
// pool, for clients that trust the cluster CA without holding its key.
func LoadPool(path string) (*x509.CertPool, error) {
	certs, err := ReadCerts(path)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p, nil
}

func parseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block")
	}
	switch blk.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(blk.Bytes)
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, err
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("unsupported key type %T", k)
		}
		return s, nil
	}
	return nil, fmt.Errorf("unexpected PEM block %q", blk.Type)
}

// ControlPlaneCN is the common name of the client certificate the control
// plane presents to agents; agents take lease-execution calls only from a
// certificate of the cluster CA with this name. Node certificates are
// named by node IDs, which never take this form.
const ControlPlaneCN = "rialto-controlplane"

// NewKey makes a P-256 key and returns it with its PEM encoding.
func NewKey() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// ParseKey parses a PEM private key (SEC 1 or PKCS #8).
func ParseKey(keyPEM []byte) (crypto.Signer, error) {
	k, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: key: %w", err)
	}
	return k, nil
}

// CSR makes a PEM certificate signing request for key, naming commonName
// (may be empty: the CA names the holder) and hosts.
func CSR(key crypto.Signer, commonName string, hosts []string) ([]byte, error) {
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"Rialto"}, CommonName: commonName}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// NewCSR makes a P-256 key and a CSR for commonName and hosts, for a holder
// that keeps its key and asks the CA (through the control plane) to sign.
func NewCSR(commonName string, hosts []string) (csrPEM, keyPEM []byte, err error) {
	key, keyPEM, err := NewKey()
	if err != nil {
		return nil, nil, err
	}
	csrPEM, err = CSR(key, commonName, hosts)
	if err != nil {
		return nil, nil, err
	}
	return csrPEM, keyPEM, nil
}

// WriteFiles writes a certificate directory in the layout libnbd
// (tls-certificates=DIR), nbdkit (--tls-certificates=DIR) and qemu
// (tls-creds-x509,dir=DIR) read: ca-cert.pem, and ROLE-cert.pem and
// ROLE-key.pem (0600) where role is "client" or "server". The directory is
// created 0700.
func WriteFiles(dir, role string, caPEM, certPEM, keyPEM []byte) error {
	if role != "client" && role != "server" {
		return fmt.Errorf("pki: role %q (want client or server)", role)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := writeAtomic(filepath.Join(dir, CACertFile), caPEM, 0o644); err != nil {
		return err
	}
	if certPEM != nil {
		if err := writeAtomic(filepath.Join(dir, role+"-cert.pem"), certPEM, 0o644); err != nil {
			return err
		}
	}
	if keyPEM != nil {
		if err := writeAtomic(filepath.Join(dir, role+"-key.pem"), keyPEM, 0o600); err != nil {
			return err
		}
	}
	return nil
}
