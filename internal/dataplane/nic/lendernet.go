package nic

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/rialto-project/rialto/internal/childenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostNet is the lender's kernel configuration for one lent interface
// (docs/nic.md, "The lender"): an nftables table that marks what comes out
// of the leases' TUN interfaces, lets it leave only through the lent
// interface, masquerades it there, admits only replies back into the
// TUNs, and refuses it any local delivery; a policy-routing rule sends
// marked packets to a table holding only the lent interface's routes.
type hostNet struct {
	iface  string
	link   netlink.Link
	mark   uint32 // fwmark and routing table id
	table  string // nftables table name
	oldFwd string // the lent interface's forwarding sysctl before
	routes []netip.Prefix
}

// Available returns nil if this machine can lend NICs: root (CAP_NET_ADMIN),
// /dev/net/tun and nft(8).
func Available() error {
	if unix.Geteuid() != 0 {
		return errors.New("nic: lending or attaching a NIC needs root (CAP_NET_ADMIN)")
	}
	if err := unix.Access("/dev/net/tun", unix.R_OK|unix.W_OK); err != nil {
		return fmt.Errorf("nic: /dev/net/tun: %w", err)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("nic: nft(8) not found (install nftables)")
	}
	return nil
}

func nft(ctx context.Context, script string) error {
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Env = childenv.Environ() // nft needs none of Rialto's settings or secrets
	cmd.Stdin = strings.NewReader(script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nic: nft: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func setupHostNet(ctx context.Context, iface string) (*hostNet, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	link, err := netlink.LinkByName(iface)
	if err != nil {
		return nil, fmt.Errorf("nic: lent interface %q: %w", iface, err)
	}
	idx := link.Attrs().Index
	h := &hostNet{iface: iface, link: link, mark: 0x52490000 | uint32(idx&0xffff), table: fmt.Sprintf("rialto_nic_%d", idx)}
	h.teardown(ctx) // what a crashed predecessor left
	h.oldFwd = strings.TrimSpace(readSysctl("ipv4/conf/" + iface + "/forwarding"))
	if err := h.syncRoutes(); err != nil {
		return nil, err
	}
	guard := ""
	if h.oldFwd != "1" {
		// The lent interface forwards only for the leases.
		guard = fmt.Sprintf("\t\tiifname %q drop\n", iface)
	}
	script := fmt.Sprintf(`table ip %[1]s {
	set tuns { type ifname; }
	chain leases_pre {
		type filter hook prerouting priority mangle; policy accept;
		iifname @tuns meta mark set %#[2]x
	}
	chain leases_in {
		type filter hook input priority filter - 10; policy accept;
		iifname @tuns drop
	}
	chain leases_fwd {
		type filter hook forward priority filter - 10; policy accept;
		iifname @tuns oifname != %[3]q drop
		iifname @tuns accept
		oifname @tuns ct state established,related accept
		oifname @tuns drop
%[4]s	}
	chain leases_nat {
		type nat hook postrouting priority srcnat; policy accept;
		meta mark %#[2]x oifname %[3]q masquerade
	}
}
`, h.table, h.mark, iface, guard)
	if err := nft(ctx, script); err != nil {
		return nil, err
	}
	rule := netlink.NewRule()
	rule.Mark = h.mark
	rule.Table = int(h.mark)
	rule.Priority = 1000 + idx%1000
	rule.Family = netlink.FAMILY_V4
	if err := netlink.RuleAdd(rule); err != nil {
		h.teardown(ctx)
		return nil, fmt.Errorf("nic: ip rule: %w", err)
	}
	if err := sysctl("ipv4/conf/"+iface+"/forwarding", "1"); err != nil {
		h.teardown(ctx)
		return nil, err
	}
	return h, nil
}

// syncRoutes copies the lent interface's IPv4 routes of the main table
// into the leases' table and remembers their prefixes (what a borrower can
// reach).
func (h *hostNet) syncRoutes() error {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: h.link.Attrs().Index, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("nic: routes of %s: %w", h.iface, err)
	}
	var prefixes []netip.Prefix
	for _, r := range rs {
		nr := r
		nr.Table = int(h.mark)
		nr.Protocol = unix.RTPROT_STATIC
		if err := netlink.RouteReplace(&nr); err != nil {
			return fmt.Errorf("nic: route %v in table %d: %w", r.Dst, h.mark, err)
		}
		p := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if r.Dst != nil {
			a, _ := netip.AddrFromSlice(r.Dst.IP.To4())
			ones, _ := r.Dst.Mask.Size()
			p = netip.PrefixFrom(a, ones).Masked()
		}
		prefixes = append(prefixes, p)
	}
	if len(prefixes) == 0 {
		return fmt.Errorf("nic: lent interface %s has no IPv4 route (no address?)", h.iface)
	}
	h.routes = prefixes
	return nil
}

// addTUN admits a lease's TUN interface, whose borrower has address addr.
func (h *hostNet) addTUN(ctx context.Context, name string, addr netip.Addr) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("nic: %s: %w", name, err)
	}
	for _, kv := range [][2]string{{"forwarding", "1"}, {"rp_filter", "1"}, {"accept_local", "0"}} {
		if err := sysctl("ipv4/conf/"+name+"/"+kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := h.route(l, addr, true); err != nil {
		return err
	}
	return nft(ctx, fmt.Sprintf("add element ip %s tuns { %q }\n", h.table, name))
}

// route adds (or deletes) the borrower's /32 through its TUN interface, in
// the main table and in the leases' table.
func (h *hostNet) route(l netlink.Link, addr netip.Addr, add bool) error {
	for _, table := range []int{unix.RT_TABLE_MAIN, int(h.mark)} {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(addr, 32)), Table: table, Scope: netlink.SCOPE_LINK}
		var err error
		if add {
			err = netlink.RouteReplace(r)
		} else {
			err = netlink.RouteDel(r)
		}
		if err != nil && add {
			return fmt.Errorf("nic: route %v dev %s: %w", addr, l.Attrs().Name, err)
		}
	}
	return nil
}

// removeTUN forgets a lease's TUN interface (closing its descriptor
// deletes it and its routes).
func (h *hostNet) removeTUN(ctx context.Context, name string) {
	_ = nft(ctx, fmt.Sprintf("delete element ip %s tuns { %q }\n", h.table, name))
}

// teardown removes the table, the rule and the routes (also a previous
// process's). Errors are ignored: there may be nothing to remove.
func (h *hostNet) teardown(ctx context.Context) {
	_ = nft(ctx, fmt.Sprintf("table ip %[1]s {}\ndelete table ip %[1]s\n", h.table))
	rule := netlink.NewRule()
	rule.Mark = h.mark
	rule.Table = int(h.mark)
	rule.Family = netlink.FAMILY_V4
	for range 8 {
		if netlink.RuleDel(rule) != nil {
			break
		}
	}
	rs, _ := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: int(h.mark)}, netlink.RT_FILTER_TABLE)
	for _, r := range rs {
		_ = netlink.RouteDel(&r)
	}
}

// close undoes setupHostNet.
func (h *hostNet) close(ctx context.Context) {
	h.teardown(ctx)
	if h.oldFwd != "" && h.oldFwd != "1" {
		_ = sysctl("ipv4/conf/"+h.iface+"/forwarding", h.oldFwd)
	}
}
