package borrower

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
	"github.com/rialto-project/rialto/internal/pki"
)

// NICConfig configures AttachNIC; zero fields take nic.Config's defaults.
type NICConfig struct {
	Name         string   // the TUN interface (default "rnic0")
	Mode         nic.Mode // a composed lease's bond mode (default flow)
	Conns        int      // connections per lender
	DefaultRoute bool     // also route everything else through it
	// TLS returns the client configuration for lenders whose tunnels run
	// under TLS (rialto-nics://, the default): normally one that trusts
	// the cluster CA's certificates (pki.LoadClientTLS, or
	// pki.Roots.ClientTLS for the certificates in use as they change);
	// the lender's node certificate must chain to them and name the host
	// of the lender's URI. It is called at each dial of a lender, its
	// redials included (nic.Config.TLS), as AttachConfig.TLS. Without it,
	// a lease with such a lender is refused.
	TLS func() *tls.Config
	// Lease, if set, reads the lease's current record (from the control
	// plane): a lender that refuses its URI's scheme on a redial (it was
	// restarted with the other --insecure-dataplane setting, and serves
	// rialto-nic:// where it served rialto-nics://, or the other way) is
	// redialled with its part's URI in it (nic.Config.Refresh).
	Lease func(ctx context.Context) (api.Lease, error)
	// Track, if set, is handed each tunnel connection under TLS
	// (nic.Config.Track): normally the Tracker of the revocation list
	// TLS checks lenders with (pki.Roots.Tracker), so that the tunnels to
	// a lender whose certificate a later list revokes end then, and the
	// lender is dropped from the bond when its redial is refused.
	Track  pki.TrackFunc
	Logger *slog.Logger
}

// NICURIs returns the lenders of active NIC lease l, one per part that is
// not lost (a lease of one part may carry its URI on the lease only).
func NICURIs(l api.Lease) ([]nic.URI, error) {
	_, uris, err := nicLenders(l)
	return uris, err
}

// nicLenders returns the parts of l that are not lost and their lenders.
func nicLenders(l api.Lease) ([]int, []nic.URI, error) {
	if l.Kind != api.KindNIC {
		return nil, nil, fmt.Errorf("lease %s is %s %s lease, not a nic lease", l.ID, l.Kind.Article(), l.Kind)
	}
	if l.State != api.LeaseActive {
		return nil, nil, fmt.Errorf("lease %s is %s, not active", l.ID, l.State)
	}
	var parts []int
	var raw []string
	for i, p := range l.Parts {
		if p.Lost() {
			continue
		}
		if p.URI == "" {
			if len(l.Parts) == 1 && l.URI != "" {
				break
			}
			return nil, nil, fmt.Errorf("lease %s: part %d has no URI", l.ID, i)
		}
		parts, raw = append(parts, i), append(raw, p.URI)
	}
	// A lease of one part may carry its URI on the lease only; not one
	// whose part is lost (the lease's URI names the lost lender).
	if len(raw) == 0 && l.URI != "" && (len(l.Parts) == 0 || len(l.Parts) == 1 && !l.Parts[0].Lost()) {
		parts, raw = []int{0}, []string{l.URI}
	}
	if len(raw) == 0 {
		if len(l.Parts) > 0 {
			return nil, nil, fmt.Errorf("lease %s: every part is lost", l.ID)
		}
		return nil, nil, fmt.Errorf("lease %s has no URI", l.ID)
	}
	uris := make([]nic.URI, len(raw))
	for k, s := range raw {
		u, err := nic.ParseURI(s)
		if err != nil {
			return nil, nil, fmt.Errorf("lease %s part %d: %w", l.ID, parts[k], err)
		}
		uris[k] = u
	}
	return parts, uris, nil
}

// nicPartURI is the lender of part i of NIC lease l, as its record has it
// now (a lease of one part may carry its URI on the lease only).
func nicPartURI(l api.Lease, i int) (nic.URI, error) {
	raw := ""
	if i < len(l.Parts) {
		raw = l.Parts[i].URI
	}
	if raw == "" && len(l.Parts) <= 1 {
		raw = l.URI
	}
	if raw == "" {
		return nic.URI{}, fmt.Errorf("lease %s: part %d has no URI", l.ID, i)
	}
	u, err := nic.ParseURI(raw)
	if err != nil {
		return nic.URI{}, fmt.Errorf("lease %s part %d: %w", l.ID, i, err)
	}
	return u, nil
}

// NICAttachment is an attached NIC lease: its interface (a bond when the
// lease has several lenders), and which part of the lease each of its
// lenders serves.
type NICAttachment struct {
	*nic.Interface
	parts []int // member k serves part parts[k]
	mu    sync.Mutex
	gone  map[int]bool // parts dropped
}

// DropLost drops from the bond the lenders of the parts that l, the
// attached lease's current record, marks lost (api.PartLost: the control
// plane declared their node down and the lease went on without them), so
// that they are no longer redialled; the bond goes on with the others. It
// returns the parts it dropped now.
func (a *NICAttachment) DropLost(l api.Lease) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []int
	for k, i := range a.parts {
		if i < len(l.Parts) && l.Parts[i].Lost() && !a.gone[i] {
			if a.gone == nil {
				a.gone = map[int]bool{}
			}
			a.gone[i] = true
			_ = a.Drop(k)
			out = append(out, i)
		}
	}
	return out
}

// Lenders is how many lenders of the attachment are not dropped.
func (a *NICAttachment) Lenders() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.parts) - len(a.gone)
}

// AttachNIC attaches NIC lease l in the caller's network namespace: a TUN
// interface whose traffic leaves through the lease's lenders (a bond when
// the lease has several parts; parts already lost are left out), with the
// address they give and routes to what they reach (docs/nic.md). It needs
// root. The attachment owns its connections until Close; DropLost drops
// the lenders of parts lost since.
func AttachNIC(ctx context.Context, l api.Lease, cfg NICConfig) (*NICAttachment, error) {
	parts, uris, err := nicLenders(l)
	if err != nil {
		return nil, err
	}
	ms := make([]nic.Member, len(uris))
	for i, u := range uris {
		ms[i] = u.Member()
		if u.TLS && cfg.TLS == nil {
			return nil, fmt.Errorf("lease %s: %w: its lender %s serves its tunnel under TLS (%s://) and no cluster CA is configured to verify it (--cacert or RIALTO_CACERT)",
				l.ID, nic.ErrNoCA, u.Address, nic.SchemeTLS)
		}
	}
	var refresh func(context.Context, int) (nic.Member, error)
	if cfg.Lease != nil {
		refresh = func(ctx context.Context, k int) (nic.Member, error) {
			cur, err := cfg.Lease(ctx)
			if err != nil {
				return nic.Member{}, err
			}
			u, err := nicPartURI(cur, parts[k])
			if err != nil {
				return nic.Member{}, err
			}
			return u.Member(), nil
		}
	}
	i, err := nic.Attach(ctx, nic.Config{Members: ms, Mode: cfg.Mode, Conns: cfg.Conns, Name: cfg.Name,
		DefaultRoute: cfg.DefaultRoute, TLS: cfg.TLS, Track: cfg.Track, Refresh: refresh, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", l.ID, err)
	}
	return &NICAttachment{Interface: i, parts: parts}, nil
}
