package nic

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
)

// Scheme is the URI scheme of a NIC lease's lender.
const Scheme = "rialto-nic"

// URI names one lender of a NIC lease: its tunnel endpoint and the lease
// credential, rialto-nic://HOST:PORT/CREDENTIAL (a bond has one per
// lender). The credential is a secret: log Redacted, never String; a URI
// logged through log/slog is redacted.
type URI struct {
	Address    string
	Credential string
}

var (
	errNotNICURI       = errors.New("nic: not a NIC URI (want rialto-nic://HOST:PORT/CREDENTIAL)")
	errNoURICredential = errors.New("nic: NIC URI without a credential")
)

// ParseURI parses rialto-nic://HOST:PORT/CREDENTIAL. Errors never quote
// the input, which carries the credential.
func ParseURI(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != Scheme || u.Host == "" || u.Port() == "" {
		return URI{}, errNotNICURI
	}
	cred := strings.TrimPrefix(u.Path, "/")
	if cred == "" {
		return URI{}, errNoURICredential
	}
	if len(cred) > MaxCredential {
		return URI{}, errNotNICURI
	}
	return URI{Address: u.Host, Credential: cred}, nil
}

// String is the wire form.
func (u URI) String() string {
	return (&url.URL{Scheme: Scheme, Host: u.Address, Path: "/" + u.Credential}).String()
}

// Redacted is String with the credential replaced by "xxxxx".
func (u URI) Redacted() string { return URI{Address: u.Address, Credential: "xxxxx"}.String() }

// LogValue logs the URI redacted.
func (u URI) LogValue() slog.Value { return slog.StringValue(u.Redacted()) }

// Member is the bond member the URI names.
func (u URI) Member() Member { return Member{Addr: u.Address, Credential: u.Credential} }
