package accel

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
)

// URIScheme is the URI scheme of an accelerator lease; URISchemeTLS names
// targets that require TLS (their certificate issued by the cluster CA for
// the lender's host).
const (
	URIScheme    = "rialto-accel"
	URISchemeTLS = "rialto-accels"
)

// URI names what an accelerator lease is reached at, and the credential
// that opens it:
//
//	rialto-accel://HOST:PORT/CREDENTIAL[?slots=HOST:PORT,…]  a dedicated lease's slots
//	rialto-accel://HOST:PORT/CREDENTIAL?gateway=ROLE          a shared lease: its lender's gateway for ROLE
//
// and the same with rialto-accels:// for targets that require TLS.
//
// The credential is a secret. String is the wire form (what the agent
// answers the control plane and a lease record holds); log and report
// Redacted, never String. A URI logged through log/slog is redacted
// (LogValue).
type URI struct {
	// Slots are the addresses of a dedicated lease's slots, the URI's host
	// first; for a shared lease, the gateway's address alone. An address
	// holds no ",".
	Slots      []string
	Credential string // the lease's export name
	Gateway    string // the gateway's role, for a shared lease; "" for a dedicated one
	TLS        bool   // the rialto-accels scheme: connect over TLS
}

// Parse errors. They never quote the input, which carries the credential.
var (
	errNotAccelURI     = errors.New("not an accelerator URI (want rialto-accel:// or rialto-accels://HOST:PORT/CREDENTIAL)")
	errNoURICredential = errors.New("accelerator URI without a credential")
)

// ParseURI parses an accelerator lease's URI (see URI). The credential is
// the unescaped path without its leading slash; empty entries of "slots"
// are skipped, and other query parameters and a fragment are ignored.
func ParseURI(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != URIScheme && u.Scheme != URISchemeTLS) || u.Host == "" {
		return URI{}, errNotAccelURI
	}
	q := u.Query()
	t := URI{Slots: []string{u.Host}, Credential: strings.TrimPrefix(u.Path, "/"), Gateway: q.Get("gateway"), TLS: u.Scheme == URISchemeTLS}
	if t.Credential == "" {
		return URI{}, errNoURICredential
	}
	if more := q.Get("slots"); more != "" {
		for _, a := range strings.Split(more, ",") {
			if a != "" {
				t.Slots = append(t.Slots, a)
			}
		}
	}
	return t, nil
}

// Shared reports whether the URI is a shared lease's (its lender's
// gateway's).
func (u URI) Shared() bool { return u.Gateway != "" }

// String is the wire form. The credential is escaped as a URI path, and the
// further slots and the gateway's role as query values, escaping only what
// would change their meaning: for the addresses and credentials the agent
// hands out, the string is byte for byte the concatenation
// the scheme + "://" + Slots[0] + "/" + Credential, then "?slots=" + the
// further slots joined by "," or "?gateway=" + Gateway.
func (u URI) String() string {
	host := ""
	if len(u.Slots) > 0 {
		host = u.Slots[0]
	}
	v := url.URL{Scheme: URIScheme, Host: host, Path: "/" + u.Credential}
	if u.TLS {
		v.Scheme = URISchemeTLS
	}
	var q []string
	if len(u.Slots) > 1 {
		more := make([]string, 0, len(u.Slots)-1)
		for _, a := range u.Slots[1:] {
			more = append(more, queryEscape(a))
		}
		q = append(q, "slots="+strings.Join(more, ","))
	}
	if u.Gateway != "" {
		q = append(q, "gateway="+queryEscape(u.Gateway))
	}
	s := v.String()
	if len(q) > 0 {
		s += "?" + strings.Join(q, "&")
	}
	return s
}

// Redacted is String with the credential replaced by "xxxxx": safe for
// logs and error messages.
func (u URI) Redacted() string {
	r := u
	r.Credential = "xxxxx"
	return r.String()
}

// LogValue logs the URI redacted.
func (u URI) LogValue() slog.Value { return slog.StringValue(u.Redacted()) }

// queryEscape percent-escapes s as one value of the query, keeping the
// characters an address or a role name is made of (letters, digits,
// "-._~", and ":[]" of host:port and IPv6 literals) and escaping the rest,
// among them the "," that separates slots and the "&", "=", "+", ";", "#"
// and "%" that would change how the query parses.
func queryEscape(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '-', c == '.', c == '_', c == '~', c == ':', c == '[', c == ']':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}
