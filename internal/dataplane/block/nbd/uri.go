package nbd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// DefaultPort is the IANA port for NBD.
const DefaultPort = "10809"

// errPSK refuses TLS-PSK in the Go client: crypto/tls implements no
// external pre-shared keys, and package tlspsk only the server side (the
// agents' NBD servers take libnbd's tls-psk-file).
var errPSK = fmt.Errorf("%w: TLS with a pre-shared key (tls-psk-file) in Rialto's own NBD client: use X.509 certificates (tls-certificates=DIR); libnbd clients can use tls-psk-file with an agent given --tls-psk", ErrUnsupported)

func parseURI(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil {
		// url.Error quotes the whole input, which carries the export
		// name (a lease credential): report only the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return URI{}, fmt.Errorf("nbd: bad URI: %v", err)
	}
	export := strings.TrimPrefix(u.Path, "/")
	q := u.Query()
	var out URI
	switch u.Scheme {
	case "nbd", "nbds":
		if u.Host == "" {
			return URI{}, fmt.Errorf("nbd: bad URI: no host")
		}
		host, port := u.Hostname(), u.Port()
		if host == "" || strings.Contains(host, ":") && net.ParseIP(host) == nil {
			return URI{}, fmt.Errorf("nbd: bad URI: bad host")
		}
		if port == "" {
			port = DefaultPort
		}
		out = URI{Network: "tcp", Address: net.JoinHostPort(host, port), Export: export}
	case "nbd+unix", "nbds+unix":
		if u.Host != "" {
			return URI{}, fmt.Errorf("nbd: bad URI: %s takes no host", u.Scheme)
		}
		sock := q.Get("socket")
		if sock == "" {
			return URI{}, fmt.Errorf("nbd: bad URI: %s needs ?socket=PATH", u.Scheme)
		}
		out = URI{Network: "unix", Address: sock, Export: export}
	default:
		return URI{}, fmt.Errorf("nbd: bad URI scheme %q", u.Scheme)
	}
	out.TLS = strings.HasPrefix(u.Scheme, "nbds")
	if q.Has("tls-psk-file") {
		return URI{}, errPSK
	}
	if out.TLS {
		out.TLSCertificates = q.Get("tls-certificates")
	}
	return out, nil
}

// String formats the URI in the nbd://, nbds://, nbd+unix:// or
// nbds+unix:// form, escaping the export name.
func (u URI) String() string {
	scheme, q := "nbd", ""
	if u.TLS {
		scheme = "nbds"
		if u.TLSCertificates != "" {
			q = "tls-certificates=" + queryEscape(u.TLSCertificates)
		}
	}
	if u.Network == "unix" {
		sq := "socket=" + queryEscape(u.Address)
		if q != "" {
			sq += "&" + q
		}
		v := url.URL{Scheme: scheme + "+unix", Path: "/" + u.Export, RawQuery: sq}
		return v.String()
	}
	v := url.URL{Scheme: scheme, Host: u.Address, Path: "/" + u.Export, RawQuery: q}
	return v.String()
}

// queryEscape escapes a query value: everything but unreserved characters
// and slashes is percent-encoded (spaces too, as %20: libnbd does not read
// "+" as a space).
func queryEscape(s string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~/", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}
