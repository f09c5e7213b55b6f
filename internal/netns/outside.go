package netns

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
)

// OutsideConfig describes a network beyond some hosts of a lab (for
// example the network a host lends its interface to, internal/dataplane/nic).
type OutsideConfig struct {
	// Hosts are the indexes of the hosts that get an uplink.
	Hosts []int
	// Rate, Burst and Latency shape every uplink in both directions, as
	// Config's fields shape the lab's links. Empty Rate: unshaped.
	Rate, Burst, Latency string
}

// Uplink is one host's link to the outside.
type Uplink struct {
	Host         int
	Iface        string       // in the host's namespace ("wan0")
	Addr         netip.Addr   // the host's address on it
	Peer         netip.Addr   // the outside's address on it (the host's gateway there)
	Prefix       netip.Prefix // the link's subnet
	OutsideIface string       // in the outside namespace
}

// Outside is a namespace joined to some hosts by veth pairs of their own
// ("uplinks"), with an address, Server, on its loopback interface that
// each uplinked host routes to through its uplink. Nothing else reaches
// the outside: the bridge and the root namespace have no route to it, and
// the hosts do not forward. Uplink k (the k-th host of OutsideConfig.Hosts)
// has subnet 10.214.k.0/24: the host gets .2, the outside .1; Server is
// 10.215.0.1.
type Outside struct {
	Namespace string
	Server    netip.Addr
	Uplinks   []Uplink
}

// ServerPrefix is the prefix of Outside.Server that the uplinked hosts route.
var ServerPrefix = netip.MustParsePrefix("10.215.0.0/24")

// AddOutside creates the outside namespace and its uplinks. Close removes
// them with the lab. A lab has at most one outside.
func (l *Lab) AddOutside(ctx context.Context, cfg OutsideConfig) (*Outside, error) {
	if l.outside != nil {
		return nil, fmt.Errorf("%w: the lab already has an outside", ErrBadConfig)
	}
	if len(cfg.Hosts) == 0 || len(cfg.Hosts) > 250 {
		return nil, fmt.Errorf("%w: %d uplinked hosts", ErrBadConfig, len(cfg.Hosts))
	}
	if cfg.Rate != "" {
		if _, err := ParseRate(cfg.Rate); err != nil {
			return nil, err
		}
	}
	if cfg.Latency == "" {
		cfg.Latency = "25ms"
	}
	o := &Outside{Namespace: fmt.Sprintf("%s-%s-out", l.prefixName(), l.id), Server: netip.MustParseAddr("10.215.0.1")}
	l.outside = o
	steps := [][]string{
		{"ip", "netns", "add", o.Namespace},
		{"ip", "-n", o.Namespace, "link", "set", "lo", "up"},
		{"ip", "-n", o.Namespace, "addr", "add", o.Server.String() + "/32", "dev", "lo"},
	}
	for k, hi := range cfg.Hosts {
		if hi < 0 || hi >= len(l.hosts) {
			return nil, fmt.Errorf("%w: host %d", ErrBadConfig, hi)
		}
		h := l.hosts[hi]
		u := Uplink{Host: hi, Iface: "wan0", OutsideIface: "u" + strconv.Itoa(hi),
			Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 214, byte(k + 1), 0}), 24),
			Addr:   netip.AddrFrom4([4]byte{10, 214, byte(k + 1), 2}), Peer: netip.AddrFrom4([4]byte{10, 214, byte(k + 1), 1})}
		o.Uplinks = append(o.Uplinks, u)
		steps = append(steps,
			[]string{"ip", "-n", h.Namespace, "link", "add", u.Iface, "type", "veth", "peer", "name", u.OutsideIface, "netns", o.Namespace},
			[]string{"ip", "-n", h.Namespace, "addr", "add", u.Addr.String() + "/24", "dev", u.Iface},
			[]string{"ip", "-n", h.Namespace, "link", "set", u.Iface, "up"},
			[]string{"ip", "-n", o.Namespace, "addr", "add", u.Peer.String() + "/24", "dev", u.OutsideIface},
			[]string{"ip", "-n", o.Namespace, "link", "set", u.OutsideIface, "up"},
			[]string{"ip", "-n", h.Namespace, "route", "add", ServerPrefix.String(), "via", u.Peer.String(), "dev", u.Iface},
		)
		if cfg.Rate != "" {
			burst := cfg.Burst
			if burst == "" {
				bps, _ := ParseRate(cfg.Rate)
				burst = strconv.FormatInt(max(32<<10, bps/8*2/1000), 10) + "b"
			}
			for _, end := range [][2]string{{h.Namespace, u.Iface}, {o.Namespace, u.OutsideIface}} {
				steps = append(steps, []string{"tc", "-n", end[0], "qdisc", "add", "dev", end[1], "root", "tbf",
					"rate", cfg.Rate, "burst", burst, "latency", cfg.Latency})
			}
		}
	}
	for _, s := range steps {
		if _, err := l.run(ctx, s...); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Command returns a command that runs name inside the outside namespace.
func (o *Outside) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", o.Namespace, name}, args...)...)
}

// Do runs f on an OS thread that has entered the outside namespace, as
// Lab.Do does for a host.
func (o *Outside) Do(f func() error) error { return doIn(o.Namespace, f) }
