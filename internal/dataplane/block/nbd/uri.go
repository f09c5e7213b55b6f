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
	switch u.Scheme {
	case "nbd":
		if u.Host == "" {
			return URI{}, fmt.Errorf("nbd: bad URI: no host")
		}
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = DefaultPort
		}
		return URI{Network: "tcp", Address: net.JoinHostPort(host, port), Export: export}, nil
	case "nbd+unix":
		if u.Host != "" {
			return URI{}, fmt.Errorf("nbd: bad URI: nbd+unix takes no host")
		}
		sock := u.Query().Get("socket")
		if sock == "" {
			return URI{}, fmt.Errorf("nbd: bad URI: nbd+unix needs ?socket=PATH")
		}
		return URI{Network: "unix", Address: sock, Export: export}, nil
	case "nbds", "nbds+unix":
		return URI{}, fmt.Errorf("%w: TLS (%s)", ErrUnsupported, u.Scheme)
	}
	return URI{}, fmt.Errorf("nbd: bad URI scheme %q", u.Scheme)
}

// String formats the URI in the nbd:// or nbd+unix:// form, escaping the
// export name.
func (u URI) String() string {
	if u.Network == "unix" {
		v := url.URL{Scheme: "nbd+unix", Path: "/" + u.Export, RawQuery: url.Values{"socket": {u.Address}}.Encode()}
		return v.String()
	}
	v := url.URL{Scheme: "nbd", Host: u.Address, Path: "/" + u.Export}
	return v.String()
}
