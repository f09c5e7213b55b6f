package protocol

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
)

// Scheme is the URI scheme of a memory lease's region; SchemeTLS names a
// donor that serves the protocol over TLS (its certificate issued by the
// cluster CA for the donor's host).
const (
	Scheme    = "rialto-mem"
	SchemeTLS = "rialto-mems"
)

// URI names a memory lease's region: the donor's address and the
// credential that opens it, rialto-mem://HOST:PORT/CREDENTIAL, or
// rialto-mems://HOST:PORT/CREDENTIAL for a donor that requires TLS.
//
// The credential is a secret. String is the wire form (what the agent
// answers the control plane and a lease record holds); log and report
// Redacted, never String. A URI logged through log/slog is redacted
// (LogValue).
type URI struct {
	Address    string // the donor's HOST:PORT
	Credential string // the lease's export name
	TLS        bool   // the rialto-mems scheme: connect over TLS
}

// Parse errors. They never quote the input, which carries the credential.
var (
	errNotMemoryURI    = errors.New("not a memory URI (want rialto-mem:// or rialto-mems://HOST:PORT/CREDENTIAL)")
	errNoURICredential = errors.New("memory URI without a credential")
)

// ParseURI parses rialto-mem://HOST:PORT/CREDENTIAL and its TLS form
// rialto-mems://. A query or fragment is ignored; the credential is the
// unescaped path without its leading slash.
func ParseURI(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != Scheme && u.Scheme != SchemeTLS) || u.Host == "" {
		return URI{}, errNotMemoryURI
	}
	cred := strings.TrimPrefix(u.Path, "/")
	if cred == "" {
		return URI{}, errNoURICredential
	}
	return URI{Address: u.Host, Credential: cred, TLS: u.Scheme == SchemeTLS}, nil
}

// String is the wire form, rialto-mem://HOST:PORT/CREDENTIAL (or
// rialto-mems://), with the credential escaped as a URI path. A credential
// made of letters, digits and "-._~" (every lease credential is) appears
// as it is: the string is byte for byte the scheme, "://", Address, "/"
// and Credential.
func (u URI) String() string {
	v := url.URL{Scheme: Scheme, Host: u.Address, Path: "/" + u.Credential}
	if u.TLS {
		v.Scheme = SchemeTLS
	}
	return v.String()
}

// Redacted is String with the credential replaced by "xxxxx": safe for
// logs and error messages.
func (u URI) Redacted() string {
	return URI{Address: u.Address, Credential: "xxxxx", TLS: u.TLS}.String()
}

// LogValue logs the URI redacted.
func (u URI) LogValue() slog.Value { return slog.StringValue(u.Redacted()) }
