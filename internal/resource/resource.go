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

// FormatSize prints n bytes in the largest binary unit it reaches: the one
// way sizes are printed (the CLI, the dashboard, explanations). The figure
// is exact where two decimals at most give it ("256MiB", "1.5GiB",
// "1.25GiB"), and otherwise rounded to one decimal ("523.9MiB", not
// "536432KiB"). A rounded figure never reads as a whole one: it keeps the
// decimals, up to three, that tell it from one ("1023.999MiB" a KiB short
// of 1GiB, not "1024MiB"; "3.001TiB", not "3TiB"), so that "free, needs"
// never shows the same figure twice.
func FormatSize(n int64) string {
	const names = "KMGTPE"
	if n < 1024 {
		return strconv.FormatInt(n, 10) + "B"
	}
	i, u := 0, int64(1024)
	for i < len(names)-1 && n/u >= 1024 {
		i, u = i+1, u*1024
	}
	unit := string(names[i]) + "iB"
	q, r := n/u, n%u
	f := float64(q) + float64(r)/float64(u)
	if r%(u/4) == 0 { // r/u is a multiple of 1/4: exact in two decimals
		return strconv.FormatFloat(f, 'f', -1, 64) + unit
	}
	s := ""
	for prec := 1; prec <= 3; prec++ {
		s = strconv.FormatFloat(f, 'f', prec, 64)
		if strings.TrimRight(s[strings.IndexByte(s, '.')+1:], "0") != "" {
			break
		}
	}
	return s + unit
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
