package tlspsk

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
)

// Keys maps PSK identities to keys. The zero value holds none. A Keys is
// safe for concurrent use; Replace swaps its whole set at once (a key
// file reloaded), and handshakes under way keep the key they looked up.
type Keys struct {
	m atomic.Pointer[map[string][]byte]
}

// maxIdentity is the longest identity TLS can carry (a u16-prefixed
// string).
const maxIdentity = 1<<16 - 1

// minKeyLen is the shortest key taken: 128 bits. A recorded handshake
// (its binder, an HMAC under a key derived from the PSK alone) lets
// anyone test guesses of the key offline, so a short key is a weak one
// (RFC 9257, 6: external PSKs of at least 128 bits of entropy). psktool
// writes 32 bytes.
const minKeyLen = 16

// maxKeyFile bounds a key file's size.
const maxKeyFile = 16 << 20

// ErrKeyFile is wrapped by every error about a key file's contents or mode.
var ErrKeyFile = errors.New("tlspsk: key file")

// ParseKeys reads psktool's format: one "identity:hexkey" per line; blank
// lines are skipped. An identity may not be empty, contain ':' or repeat;
// a key must be hex (either case) of at least 16 bytes. Errors name the
// line, never the key.
func ParseKeys(b []byte) (*Keys, error) {
	m := map[string][]byte{}
	for i, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		id, hk, ok := bytes.Cut(line, []byte(":"))
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: line %d: not identity:hexkey", ErrKeyFile, i+1)
		case len(id) == 0 || len(id) > maxIdentity:
			return nil, fmt.Errorf("%w: line %d: the identity is empty or too long", ErrKeyFile, i+1)
		}
		key := make([]byte, hex.DecodedLen(len(hk)))
		if _, err := hex.Decode(key, hk); err != nil || len(key) == 0 {
			clear(key)
			return nil, fmt.Errorf("%w: line %d: the key is not hexadecimal", ErrKeyFile, i+1)
		}
		if len(key) < minKeyLen {
			clear(key)
			return nil, fmt.Errorf("%w: line %d: a key of %d bytes; at least %d are needed (psktool writes 32)", ErrKeyFile, i+1, len(key), minKeyLen)
		}
		if _, dup := m[string(id)]; dup {
			return nil, fmt.Errorf("%w: line %d: an identity given twice", ErrKeyFile, i+1)
		}
		m[string(id)] = key
	}
	k := &Keys{}
	k.m.Store(&m)
	return k, nil
}

// LoadKeyFile reads a key file (ParseKeys), refusing one that group or
// others may read or write, as a private key file is refused, and one that
// holds no key.
func LoadKeyFile(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tlspsk: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("tlspsk: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w %s: not a regular file", ErrKeyFile, path)
	}
	if p := st.Mode().Perm(); p&0o077 != 0 {
		return nil, fmt.Errorf("%w %s: mode %#o lets group or others in: chmod 600 it", ErrKeyFile, path, p)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	defer clear(b) // the keys' only other copy is k's
	if err != nil {
		return nil, fmt.Errorf("tlspsk: %w", err)
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("%w %s: over %d bytes", ErrKeyFile, path, maxKeyFile)
	}
	k, err := ParseKeys(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if k.Len() == 0 {
		return nil, fmt.Errorf("%w %s: no keys", ErrKeyFile, path)
	}
	return k, nil
}

// Replace makes k hold from's keys instead of its own: the next
// handshake looks its identity up among them. from must not be used
// afterwards.
func (k *Keys) Replace(from *Keys) {
	k.m.Store(from.m.Load())
}

// Len is the number of keys.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	if m := k.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}

func (k *Keys) lookup(id []byte) ([]byte, bool) {
	if k == nil {
		return nil, false
	}
	m := k.m.Load()
	if m == nil {
		return nil, false
	}
	key, ok := (*m)[string(id)]
	return key, ok
}
