package borrower

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
)

// NICConfig configures AttachNIC; zero fields take nic.Config's defaults.
type NICConfig struct {
	Name         string   // the TUN interface (default "rnic0")
	Mode         nic.Mode // a composed lease's bond mode (default flow)
	Conns        int      // connections per lender
	DefaultRoute bool     // also route everything else through it
	Logger       *slog.Logger
}

// NICURIs returns the lenders of active NIC lease l, one per part (a lease
// of one part may carry its URI on the lease only).
func NICURIs(l api.Lease) ([]nic.URI, error) {
	if l.Kind != api.KindNIC {
		return nil, fmt.Errorf("lease %s is a %s lease, not a nic lease", l.ID, l.Kind)
	}
	if l.State != api.LeaseActive {
		return nil, fmt.Errorf("lease %s is %s, not active", l.ID, l.State)
	}
	var raw []string
	for i, p := range l.Parts {
		if p.URI == "" {
			if len(l.Parts) == 1 && l.URI != "" {
				break
			}
			return nil, fmt.Errorf("lease %s: part %d has no URI", l.ID, i)
		}
		raw = append(raw, p.URI)
	}
	if len(raw) == 0 && l.URI != "" {
		raw = []string{l.URI}
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("lease %s has no URI", l.ID)
	}
	uris := make([]nic.URI, len(raw))
	for i, s := range raw {
		u, err := nic.ParseURI(s)
		if err != nil {
			return nil, fmt.Errorf("lease %s part %d: %w", l.ID, i, err)
		}
		uris[i] = u
	}
	return uris, nil
}

// AttachNIC attaches NIC lease l in the caller's network namespace: a TUN
// interface whose traffic leaves through the lease's lenders (a bond when
// the lease has several parts), with the address they give and routes to
// what they reach (docs/nic.md). It needs root. The Interface owns its
// connections until Close.
func AttachNIC(ctx context.Context, l api.Lease, cfg NICConfig) (*nic.Interface, error) {
	uris, err := NICURIs(l)
	if err != nil {
		return nil, err
	}
	ms := make([]nic.Member, len(uris))
	for i, u := range uris {
		ms[i] = u.Member()
	}
	i, err := nic.Attach(ctx, nic.Config{Members: ms, Mode: cfg.Mode, Conns: cfg.Conns, Name: cfg.Name,
		DefaultRoute: cfg.DefaultRoute, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", l.ID, err)
	}
	return i, nil
}
