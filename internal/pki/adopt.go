package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// SharedList is a revocation list kept outside the CA directory, in a
// record that several holders of copies of the directory share (the
// control plane's store): every copy that adopts it (CA.Adopt) signs the
// same entries with the same number, so a reader taking the list with the
// higher number (an agent) takes the same list from any of them.
type SharedList struct {
	Number  *big.Int
	Revoked map[string]time.Time // hex serial → revocation time
	// Expired are serials (hex) the shared list dropped because their
	// certificates expired: a directory's list naming one of them does
	// not need it added (Missing), and adopting the list drops it there
	// too.
	Expired map[string]bool
}

// Adoption is what CA.Adopt did, or what the shared list needs first.
type Adoption struct {
	// Changed: ca-crl.pem now holds the shared list.
	Changed bool
	// Missing are serials this directory's list revokes that the shared
	// list does not: add them to it, then adopt it again.
	Missing []*big.Int
	// MinNumber, when set, is the number the shared list must reach
	// before it is adopted: this directory's list has a number as high or
	// higher, and readers holding it would not take a lower one. It is
	// one more than this directory's, even when the shared list has the
	// same entries: another holder's revocation may land in the shared
	// list before it is raised, and the list raised with it must not be
	// signed with the number this directory's list, without it, has.
	// With Missing, the shared list must reach it as it takes them, in one
	// step: taking them under its number raised by one could number it as
	// this directory's list, which lacks what the shared list held, and
	// another holder would sign that list with that number.
	MinNumber *big.Int
}

// Adopt makes the CA directory's revocation list (ca-crl.pem, re-read
// first) the shared list l, signed with l's number and l's entries, once
// l holds every serial the directory's list revokes but those l dropped
// as expired (Missing otherwise, with MinNumber when l's number is not
// higher than the directory's) and its number is higher than the
// directory's (MinNumber otherwise). A directory already holding l (its
// entries, its number) is left as it is.
func (ca *CA) Adopt(l SharedList) (Adoption, error) {
	if l.Number == nil || l.Number.Sign() < 0 {
		return Adoption{}, fmt.Errorf("%w: a shared revocation list needs a number", ErrBadRequest)
	}
	unlock, err := lockDir(ca.dir)
	if err != nil {
		return Adoption{}, err
	}
	defer unlock()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	b, err := os.ReadFile(filepath.Join(ca.dir, CRLFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Adoption{}, fmt.Errorf("pki: %w", err)
	}
	if err != nil || !bytes.Equal(b, ca.crlPEM) {
		if err := ca.loadCRL(); err != nil {
			return Adoption{}, err
		}
	}
	if ca.crlForeign {
		// A rotation signed it with a key clients may not trust yet: hand
		// out (and leave in the directory) the same list signed with this
		// process's key, which they do.
		if err := ca.writeCRLNumbered(new(big.Int).Set(ca.crlNum)); err != nil {
			return Adoption{}, err
		}
	}
	var out Adoption
	same := len(l.Revoked) == len(ca.revoked)
	for s := range ca.revoked {
		if _, ok := l.Revoked[s]; ok {
			continue
		}
		same = false
		if l.Expired[s] {
			continue
		}
		if n, ok := new(big.Int).SetString(s, 16); ok {
			out.Missing = append(out.Missing, n)
		}
	}
	c := l.Number.Cmp(ca.crlNum)
	if c < 0 || (c == 0 && !same) {
		out.MinNumber = new(big.Int).Add(ca.crlNum, big.NewInt(1))
	}
	if len(out.Missing) > 0 {
		sort.Slice(out.Missing, func(i, j int) bool { return out.Missing[i].Cmp(out.Missing[j]) < 0 })
		return out, nil
	}
	if c <= 0 {
		return out, nil
	}
	ca.revoked = make(map[string]time.Time, len(l.Revoked))
	for s, at := range l.Revoked {
		ca.revoked[s] = at
	}
	if err := ca.writeCRLNumbered(new(big.Int).Set(l.Number)); err != nil {
		return Adoption{}, err
	}
	out.Changed = true
	return out, nil
}

// IssuedTo returns the serial numbers of the certificates in the index,
// not yet expired, whose common name is commonName (RevokeIssuedTo's,
// without revoking them).
func (ca *CA) IssuedTo(commonName string) ([]*big.Int, error) {
	unlock, _, issued, err := ca.lockIssuedTo(commonName)
	if err != nil {
		return nil, err
	}
	unlock()
	return issued, nil
}
