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

// ErrBadRate is returned for a rate that cannot be parsed.
var ErrBadRate = errors.New("resource: bad rate")

// ParseRate parses a rate into bytes/s, as the CLI's --bandwidth and the
// quotas' bandwidth= take it: bits with a unit ending in "bit" ("500Mbit/s",
// "1gbit", "100 kbit/s"; decimal prefixes), else bytes as sizes are written
// ("200MB/s", "64MiB/s", "2e9": a bare number is bytes/s; "/s" may be left
// out). Like sizes, rates are at most 2⁶² bytes/s. It reads back what
// FormatRate and FormatLinkRate print.
func ParseRate(s string) (float64, error) {
	t := strings.TrimSpace(s)
	// Suffixes are cut from t itself: lowering first would misplace them
	// in text that is not UTF-8, whose bytes ToLower turns into U+FFFD.
	if hasSuffixFold(t, "/s") {
		t = t[:len(t)-2]
	} else if hasSuffixFold(t, "bitps") {
		t = t[:len(t)-2] // "500mbitps"
	}
	lt := strings.ToLower(t)
	bad := func() error {
		return fmt.Errorf("%w: %q: want a rate such as 500Mbit/s, 1Gbit/s or 200MB/s", ErrBadRate, s)
	}
	if num, ok := strings.CutSuffix(lt, "bit"); ok {
		mult := 1.0
		if n := len(num); n > 0 {
			switch num[n-1] {
			case 'k':
				mult, num = 1e3, num[:n-1]
			case 'm':
				mult, num = 1e6, num[:n-1]
			case 'g':
				mult, num = 1e9, num[:n-1]
			case 't':
				mult, num = 1e12, num[:n-1]
			case 'p':
				mult, num = 1e15, num[:n-1]
			case 'e':
				mult, num = 1e18, num[:n-1]
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) || v*mult/8 > math.MaxInt64/2 {
			return 0, bad() // bounded as sizes are: room for sums, and whole bytes/s fit an int64
		}
		return v * mult / 8, nil
	}
	n, err := ParseSize(t)
	if err != nil {
		return 0, bad()
	}
	return float64(n), nil
}

// hasSuffixFold is strings.HasSuffix ignoring ASCII case.
func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}

// FormatRate prints a rate of bytes/s in the largest decimal unit it
// reaches ("477MB/s", "1.25GB/s", "476.8MB/s", "4.17GB/s", "0B/s"): the
// one way bandwidths are printed (the CLI, the dashboard, explanations,
// errors). Decimal, as the API's bytes/s and storage and network rates
// are, and as --bandwidth 500MB/s reads it; ParseRate reads it back. The
// figure is exact where two decimals at most give it, as FormatSize's;
// else rounded to one decimal, but two below 10 (three figures at least,
// as explanations compare rates: "needs 1.43GB/s", "predicted
// 1.40GB/s"), keeping the decimals, up to three, that tell it from a
// whole figure. A nic's rate, which flags and tc write in bits, is
// FormatLinkRate's.
func FormatRate(bytesPerSec float64) string {
	return formatDecimal(bytesPerSec, []string{"B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s", "EB/s"})
}

// FormatLinkRate prints a rate of bytes/s as a link rate in bits/s, in
// the largest decimal unit it reaches ("500Mbit/s", "1.25Gbit/s",
// "666.7Mbit/s"), exact or rounded as FormatRate: how a nic's capacity
// and a nic lease's share print, as --bandwidth 500Mbit/s and an agent's
// --nic wan=eth1:500mbit write them. ParseRate reads it back.
func FormatLinkRate(bytesPerSec float64) string {
	return formatDecimal(bytesPerSec*8, []string{"bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s", "Pbit/s", "Ebit/s"})
}

// formatDecimal prints v in the largest of units (each 1000 times the
// one before) it reaches, exact where two decimals give it (within
// float64's noise: 99999999.99999997 is 100M), else rounded to one
// decimal, two below 10 (three figures at least, as explanations compare
// rates: 1.43GB/s needed, 1.40GB/s predicted), with more, up to three,
// where those would read as a whole figure. Non-finite values print as
// strconv does.
func formatDecimal(v float64, units []string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'f', -1, 64) + units[0]
	}
	if v < 0 {
		return "-" + formatDecimal(-v, units)
	}
	i, u := 0, 1.0
	for i < len(units)-1 && v >= u*1000 {
		i, u = i+1, u*1000
	}
	f := v / u
	if c := f * 100; math.Abs(c-math.Round(c)) <= 1e-12*max(1, c) {
		r := math.Round(c) / 100
		if r >= 1000 && i < len(units)-1 { // 999999999.9999995: 1G, not 1000M
			i, r = i+1, r/1000
		}
		return strconv.FormatFloat(r, 'f', -1, 64) + units[i]
	}
	prec := 1
	if f < 10 {
		prec = 2 // three figures at least: 1.43GB/s, not 1.4GB/s beside 1.4GB/s
	}
	s := ""
	for ; prec <= 3; prec++ {
		s = strconv.FormatFloat(f, 'f', prec, 64)
		if strings.TrimRight(s[strings.IndexByte(s, '.')+1:], "0") != "" {
			break
		}
	}
	return s + units[i]
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
