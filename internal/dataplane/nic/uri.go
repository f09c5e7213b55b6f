package nic

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// URI schemes of a NIC lease's lender: Scheme for a plaintext tunnel
// (an agent with --insecure-dataplane), SchemeTLS for one under TLS with
// the lender's node certificate.
const (
	Scheme    = "rialto-nic"
	SchemeTLS = "rialto-nics"
)

// URI names one lender of a NIC lease: its tunnel endpoint and the lease
// credential, rialto-nics://HOST:PORT/CREDENTIAL (rialto-nic:// for a
// plaintext tunnel; a bond has one per lender). The credential is a
// secret: log Redacted, never String; a URI logged through log/slog is
// redacted.
type URI struct {
	Address    string
	Credential string
	TLS        bool // rialto-nics://: the tunnel runs under TLS
}

var (
	errNotNICURI       = errors.New("nic: not a NIC URI (want rialto-nics:// or rialto-nic://HOST:PORT/CREDENTIAL)")
	errNoURICredential = errors.New("nic: NIC URI without a credential")
)

// ParseURI parses rialto-nics://HOST:PORT/CREDENTIAL and its plaintext
// form rialto-nic://. Errors never quote the input, which carries the
// credential.
func ParseURI(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != Scheme && u.Scheme != SchemeTLS) || u.Host == "" || u.Port() == "" {
		return URI{}, errNotNICURI
	}
	cred := strings.TrimPrefix(u.Path, "/")
	if cred == "" {
		return URI{}, errNoURICredential
	}
	if len(cred) > MaxCredential {
		return URI{}, errNotNICURI
	}
	return URI{Address: u.Host, Credential: cred, TLS: u.Scheme == SchemeTLS}, nil
}

// String is the wire form.
func (u URI) String() string {
	v := url.URL{Scheme: Scheme, Host: u.Address, Path: "/" + u.Credential}
	if u.TLS {
		v.Scheme = SchemeTLS
	}
	return v.String()
}

// Redacted is String with the credential replaced by "xxxxx".
func (u URI) Redacted() string {
	return URI{Address: u.Address, Credential: "xxxxx", TLS: u.TLS}.String()
}

// LogValue logs the URI redacted.
func (u URI) LogValue() slog.Value { return slog.StringValue(u.Redacted()) }

// Member is the bond member the URI names.
func (u URI) Member() Member { return Member{Addr: u.Address, Credential: u.Credential, TLS: u.TLS} }

// ParseRate parses a rate in tc's syntax ("200mbit", "1gbit", "50mbps" =
// 50 megabytes/s, a bare number = bits/s) into bits/s.
func ParseRate(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	// The whole number: "1..2mbit" is not 1mbit.
	v, err := strconv.ParseFloat(t[:i], 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("nic: rate %q", s)
	}
	mult := map[string]float64{"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
		"bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}[t[i:]]
	// Below 2^64 bits/s: a larger rate would wrap around in uint64.
	if mult == 0 || v*mult < 8 || v*mult >= 1<<64 {
		return 0, fmt.Errorf("nic: rate %q (want e.g. 200mbit, 1gbit, 50mbps)", s)
	}
	return uint64(v * mult), nil
}

// LinkSpeed is the interface's speed in bits/s as the kernel reports it,
// or 0 if it does not.
func LinkSpeed(iface string) uint64 {
	b, err := os.ReadFile("/sys/class/net/" + iface + "/speed")
	if err != nil {
		return 0
	}
	var mbit int64
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &mbit); err != nil || mbit <= 0 {
		return 0
	}
	return uint64(mbit) * 1e6
}
