package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
)

// nicAttachFlags are rialto attach's flags for nic leases.
type nicAttachFlags struct {
	iface, mode  string
	defaultRoute bool
}

func (f *nicAttachFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.iface, "iface", "rnic0", "nic: the network interface to create in this network namespace")
	fs.StringVar(&f.mode, "bond-mode", "flow", "nic, a bond of several lenders: flow (each flow pinned to one lender) or packet (also striped over several connections to each lender)")
	fs.BoolVar(&f.defaultRoute, "default-route", false, "nic: also route everything else through the interface, if its lenders reach a default route")
}

// attachNIC attaches nic lease l in this network namespace (needs root):
// a TUN interface whose traffic leaves through the lease's lenders (a bond
// when the lease has several parts, docs/nic.md), with the address they
// give and routes to what they reach; it holds it until Ctrl-C, detach or
// the lease's end, then removes it.
// Lenders serving rialto-nics:// are verified with the configuration
// dataTLS returns at each dial, their redials included: that of the CA
// certificates of --cacert in use then, which follow a CA rotation
// (clientFlags.followRoots, holdAttachment's caFollower).
func attachNIC(ctx context.Context, e *env, c *api.Client, cf *clientFlags, l api.Lease, nf nicAttachFlags, conns int, dataTLS func() *tls.Config, watch time.Duration, log *slog.Logger) error {
	mode, err := nic.ParseMode(nf.mode)
	if err != nil {
		return usagef("bad --bond-mode: %w", err)
	}
	if _, err := borrower.NICURIs(l); err != nil {
		return err
	}
	file, ctlPath, ctl, err := openAttachment(ctx, e, l.ID)
	if err != nil {
		return err
	}
	defer ctl.Close()
	// A lender restarted with the other --insecure-dataplane setting
	// serves the other scheme: its redial reads the lease again for its
	// current URI.
	readLease := func(ctx context.Context) (api.Lease, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return c.Lease(ctx, l.ID)
	}
	ifc, err := borrower.AttachNIC(ctx, l, borrower.NICConfig{Name: nf.iface, Mode: mode, Conns: conns, DefaultRoute: nf.defaultRoute, TLS: dataTLS,
		Lease: readLease, Track: cf.dataTrack(log), Logger: log})
	if err != nil {
		os.Remove(ctlPath)
		return fmt.Errorf("attach %s: %w", l.ID, err)
	}
	waitMembers(ctx, e, ifc, 10*time.Second)
	st := attachState{ID: l.ID, State: "attached", PID: os.Getpid(), Size: l.Size, Parts: len(l.Parts), Control: ctlPath,
		Started: time.Now().UTC(), Iface: ifc.Name(), Addr: ifc.Addr().String(), CACertificates: cf.caFingerprints(), CRLNumber: cf.crlNumber()}
	for _, r := range ifc.Routes() {
		st.Routes = append(st.Routes, r.String())
	}
	if err := recordAttachment(file, st); err != nil {
		ifc.Close()
		os.Remove(ctlPath)
		return err
	}
	if cf.json() {
		cf.print(e.stdout, st)
	} else {
		fmt.Fprintf(e.stdout, "%s %s\n", st.Iface, st.Addr)
		what := "1 lender"
		if n := len(l.Parts); n > 1 {
			what = fmt.Sprintf("a bond of %d lenders", n)
		}
		fmt.Fprintf(e.stderr, "rialto attach: lease %s (%s, %s) attached as %s, address %s, routes %s; Ctrl-C or `rialto detach %s` ends it\n",
			l.ID, what, capacity(api.KindNIC, l.Size), st.Iface, st.Addr, dash(strings.Join(st.Routes, ",")), l.ID)
	}
	// A lender whose part the control plane declared lost (its node down
	// past the grace period) is dropped: the bond goes on without it.
	follow := func(cur api.Lease) {
		for _, i := range ifc.DropLost(cur) {
			fmt.Fprintf(e.stderr, "rialto attach: part %d of lease %s lost (its lender's node is down); the bond goes on with %d lender(s)\n",
				i, l.ID, ifc.Lenders())
		}
	}
	return holdAttachment(ctx, c, l, ctl, file, ctlPath, watch, attachHooks{close: ifc.Close, follow: follow, ca: cf.caFollower(c, log)})
}

// waitMembers waits (at most max) until every lender of the interface is
// connected, so that the interface carries the whole bond when attach
// says it is there; lenders still down then are named on stderr (they are
// redialled in the background, and take flows once they answer).
func waitMembers(ctx context.Context, e *env, ifc *borrower.NICAttachment, max time.Duration) {
	deadline := time.Now().Add(max)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var down []nic.MemberStatus
		for _, m := range ifc.Members() {
			if !m.Up {
				down = append(down, m)
			}
		}
		if len(down) == 0 {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			for _, m := range down {
				fmt.Fprintf(e.stderr, "rialto attach: warning: lender %s not connected yet (%s); it takes flows once it answers\n", m.Addr, dash(m.Err))
			}
			return
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}
