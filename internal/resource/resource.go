package resource

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrBadSize is returned for a size that cannot be parsed.
var ErrBadSize = errors.New("resource: bad size")

var units = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"PiB", 1 << 50}, {"EiB", 1 << 60},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"PB", 1e15}, {"EB", 1e18},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// ParseSize parses sizes such as "256MiB", "2GiB", "1.5G", "4096" (bytes),
// and whatever FormatSize prints ("2PiB"). Single-letter suffixes are
// binary, as in dd and qemu-img.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) && len(t) > len(u.suffix) {
			t = strings.TrimSpace(t[:len(t)-len(u.suffix)])
			mult = u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%w: %q", ErrBadSize, s)
	}
	v := f * float64(mult)
	if v > math.MaxInt64/2 {
		return 0, fmt.Errorf("%w: %q is too large", ErrBadSize, s)
	}
	return int64(v), nil
}

// FormatSize prints n bytes with a binary unit, e.g. "256MiB", "1.5GiB".
func FormatSize(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatInt(n, 10) + "B"
	}
	f := float64(n)
	i := -1
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	s := strconv.FormatFloat(f, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + string(units[i]) + "iB"
}

var idEnc = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewID returns a random identifier with a prefix, e.g. "lease-k3j9x2m1q8".
func NewID(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("resource: crypto/rand: " + err.Error())
	}
	return prefix + "-" + idEnc.EncodeToString(b[:])[:12]
}

// NewSecret returns a random 256-bit secret in URL- and export-name-safe
// form, with a prefix naming what it is for (e.g. "rlc" for a lease
// credential), so that leaked secrets can be recognised.
func NewSecret(prefix string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("resource: crypto/rand: " + err.Error())
	}
	return prefix + "_" + idEnc.EncodeToString(b[:])
}

// Fingerprint returns a short, non-reversible tag of a secret that is safe
// to log ("sha256:1a2b3c4d").
func Fingerprint(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return "sha256:" + hex.EncodeToString(h[:4])
}

// HashSecret returns the hex SHA-256 of a secret, for storing tokens.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}
