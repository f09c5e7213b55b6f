package agent

import (
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/rialto-project/rialto/internal/letgo"
)

// portReservations holds the ports a previous run of the agent served at
// (its API, its data planes, the addresses of its exports) from before the
// devices open until each owner binds its port again. Opening an
// accelerator device listens on fresh ports, which the kernel picks among
// all free ones; without the reservations it could pick one a restored
// export or a data plane is about to bind again, and that export would
// move to a new address.
//
// The zero value holds nothing. Methods are safe for concurrent use.
type portReservations struct {
	mu  sync.Mutex
	lns map[string]net.Listener // by port
}

// reserve listens on host:port for each port, best effort: a port some
// other process holds stays theirs.
func (r *portReservations) reserve(host string, ports []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range ports {
		if p == "" || p == "0" || r.lns[p] != nil {
			continue
		}
		// Released by closing, right before the owner binds the port:
		// a child process forked meanwhile must not keep it (letgo).
		ln, err := letgo.Listen("tcp", net.JoinHostPort(host, p))
		if err != nil {
			continue
		}
		if r.lns == nil {
			r.lns = map[string]net.Listener{}
		}
		r.lns[p] = ln
	}
}

// release hands the ports back to whoever binds them next (their owner,
// right after).
func (r *portReservations) release(ports ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range ports {
		if ln := r.lns[p]; ln != nil {
			_ = ln.Close()
			delete(r.lns, p)
		}
	}
}

// releaseAll releases every port still held.
func (r *portReservations) releaseAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, ln := range r.lns {
		_ = ln.Close()
		delete(r.lns, p)
	}
}

// savedExports reads the exports a previous run persisted (none on a first
// start). ok is false if the file cannot be read, which it logs: then
// nothing is restored, and the file is left as it is.
func (a *Agent) savedExports() (saved []persistedExport, ok bool) {
	if err := readJSON(filepath.Join(a.cfg.StateDir, exportsFile), &saved); err != nil {
		a.log.Warn("reading persisted exports", "err", err)
		return nil, false
	}
	return saved, true
}

// rememberedPorts lists the ports the previous run served at: its API and
// data-plane ports (unless configured) and those in its exports' URIs.
func (a *Agent) rememberedPorts(saved []persistedExport) []string {
	a.mu.Lock()
	id := a.id
	a.mu.Unlock()
	var ports []string
	if a.cfg.APIPort == 0 {
		ports = append(ports, strconv.Itoa(id.APIPort))
	}
	for k, p := range id.DataPorts {
		if a.cfg.DataPorts[k] == 0 {
			ports = append(ports, strconv.Itoa(p))
		}
	}
	for _, e := range saved {
		ports = append(ports, uriPorts(e.URI)...)
		ports = append(ports, uriPorts(e.Moved)...)
	}
	return ports
}

// uriPorts returns the ports an export URI names: its host's and, for a
// lease of several accelerator slots, those of the further slots, in slot
// order; nil if the URI has no port or a malformed one (anything but a
// number from 1 to 65535: the URI comes from a state file, and a port
// such as "http" would be looked up as a service name).
func uriPorts(uri string) []string {
	u, err := url.Parse(uri)
	if uri == "" || err != nil || u.Host == "" {
		return nil
	}
	hosts := []string{u.Host}
	if more := u.Query().Get("slots"); more != "" {
		hosts = append(hosts, strings.Split(more, ",")...)
	}
	ports := make([]string, 0, len(hosts))
	for _, h := range hosts {
		_, port, err := net.SplitHostPort(h)
		if err != nil {
			return nil
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil
		}
		ports = append(ports, port)
	}
	return ports
}
