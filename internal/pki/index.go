package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// IndexFile lists the certificates the CA issued that may still be valid,
// one per line: serial (hex), expiry (Unix seconds), common name. It lets
// RevokeIssuedTo revoke every certificate of a holder (a removed node)
// without the caller keeping serials. Entries past their expiry are
// dropped when the index is rewritten.
const IndexFile = "issued.txt"

// indexCompactAt is how many lines the index may grow to before a record
// rewrites it without the expired entries.
const indexCompactAt = 4096

type indexEntry struct {
	serial   *big.Int
	notAfter time.Time
	cn       string
}

// record appends an issued certificate to the index. Lines are written
// with one O_APPEND write each, so that processes sharing the directory
// do not interleave them.
func (ca *CA) record(cert *x509.Certificate) error {
	cn := strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, cert.Subject.CommonName)
	line := fmt.Sprintf("%s %d %s\n", cert.SerialNumber.Text(16), cert.NotAfter.Unix(), cn)
	path := filepath.Join(ca.dir, IndexFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("pki: index: %w", err)
	}
	_, err = f.WriteString(line)
	st, serr := f.Stat()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pki: index: %w", err)
	}
	// Roughly 60 bytes a line: compact now and then.
	if serr == nil && st.Size() > indexCompactAt*60 {
		unlock, err := lockDir(ca.dir)
		if err != nil {
			return err
		}
		defer unlock()
		entries, err := ca.readIndex()
		if err != nil {
			return err
		}
		return ca.writeIndex(entries)
	}
	return nil
}

// readIndex reads the index, without the entries already expired.
func (ca *CA) readIndex() ([]indexEntry, error) {
	return ca.readIndexAfter(ca.now())
}

// readIndexAfter reads the index, without the entries expired at t (the
// zero time: none left out).
func (ca *CA) readIndexAfter(t time.Time) ([]indexEntry, error) {
	b, err := os.ReadFile(filepath.Join(ca.dir, IndexFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pki: index: %w", err)
	}
	var out []indexEntry
	// Line by line, whatever their length: a line too long for a
	// bufio.Scanner would end the read there and drop the entries after
	// it, which the next compaction would then drop from the file.
	for line := range bytes.Lines(b) {
		text := strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r")
		f := strings.SplitN(text, " ", 3)
		if len(f) != 3 {
			continue
		}
		serial, ok := new(big.Int).SetString(f[0], 16)
		sec, err := strconv.ParseInt(f[1], 10, 64)
		if !ok || err != nil {
			continue
		}
		e := indexEntry{serial: serial, notAfter: time.Unix(sec, 0), cn: f[2]}
		if e.notAfter.After(t) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (ca *CA) writeIndex(entries []indexEntry) error {
	var b bytes.Buffer
	for _, e := range entries {
		fmt.Fprintf(&b, "%s %d %s\n", e.serial.Text(16), e.notAfter.Unix(), e.cn)
	}
	return writeAtomic(filepath.Join(ca.dir, IndexFile), b.Bytes(), 0o600)
}

// lockIssuedTo locks the CA directory and reads its index: every entry
// not yet expired, and the serial numbers of those whose common name is
// commonName. The caller calls unlock (when err is nil).
func (ca *CA) lockIssuedTo(commonName string) (unlock func(), entries []indexEntry, issued []*big.Int, err error) {
	if commonName == "" {
		return nil, nil, nil, fmt.Errorf("%w: no common name", ErrBadRequest)
	}
	if unlock, err = lockDir(ca.dir); err != nil {
		return nil, nil, nil, err
	}
	if entries, err = ca.readIndex(); err != nil {
		unlock()
		return nil, nil, nil, err
	}
	for _, e := range entries {
		if e.cn == commonName {
			issued = append(issued, e.serial)
		}
	}
	return unlock, entries, issued, nil
}

// RevokeIssuedTo revokes every certificate in the index, not yet expired,
// whose common name is commonName (a node's ID: its certificates, current
// and renewed), writes the CRL once, and returns how many it revoked that
// were not revoked already (their serial numbers: replicas holding a copy
// of the CA directory revoke them in theirs).
func (ca *CA) RevokeIssuedTo(commonName string) ([]*big.Int, error) {
	unlock, entries, issued, err := ca.lockIssuedTo(commonName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if err := ca.loadCRL(); err != nil {
		return nil, err
	}
	at := ca.now().UTC().Truncate(time.Second)
	var out []*big.Int
	for _, serial := range issued {
		if _, ok := ca.revoked[serial.Text(16)]; ok {
			continue
		}
		ca.revoked[serial.Text(16)] = at
		out = append(out, serial)
	}
	if len(out) > 0 {
		if err := ca.writeCRL(); err != nil {
			return nil, err
		}
	}
	return out, ca.writeIndex(entries)
}

// NotAfter returns when the certificate of each of serials expires: as
// the index records it, or, for a serial it does not list (issued by
// another copy of the directory, or dropped from the index once
// expired), the latest expiry of the CA certificates trusted. That bounds
// every certificate they signed: sign caps a certificate's expiry at its
// signer's, and a chain through an expired CA certificate verifies
// nowhere. (A certificate of a CA this directory does not trust, such as
// one a rotation in another copy made that this copy has not taken yet,
// is not bounded so: its issue must be known, as a replica's store
// records it.)
func (ca *CA) NotAfter(serials []*big.Int) ([]time.Time, error) {
	unlock, err := lockDir(ca.dir)
	if err != nil {
		return nil, err
	}
	entries, err := ca.readIndexAfter(time.Time{})
	unlock()
	if err != nil {
		return nil, err
	}
	known := make(map[string]time.Time, len(entries))
	for _, e := range entries {
		known[e.serial.Text(16)] = e.notAfter
	}
	var bound time.Time
	ca.mu.RLock()
	for _, c := range ca.trusted {
		if c.NotAfter.After(bound) {
			bound = c.NotAfter
		}
	}
	ca.mu.RUnlock()
	out := make([]time.Time, len(serials))
	for i, n := range serials {
		if t, ok := known[n.Text(16)]; ok {
			out[i] = t
		} else {
			out[i] = bound
		}
	}
	return out, nil
}

// CRLNumber is the number of the current revocation list (it grows with
// every change).
func (ca *CA) CRLNumber() *big.Int {
	ca.mu.RLock()
	defer ca.mu.RUnlock()
	return new(big.Int).Set(ca.crlNum)
}

// ReloadIfChanged re-reads the revocation list when another process
// (sharing the directory: `rialto node remove` against another replica,
// `rialto ca`) wrote a newer one, and reports whether it did.
func (ca *CA) ReloadIfChanged() (bool, error) {
	b, err := os.ReadFile(filepath.Join(ca.dir, CRLFile))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("pki: %w", err)
	}
	ca.mu.RLock()
	same := bytes.Equal(b, ca.crlPEM)
	ca.mu.RUnlock()
	if same {
		return false, nil
	}
	return true, ca.Reload()
}
