package borrower

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/pki"
)

// LeaseSource gives the current record of a lease: *api.Client is one.
type LeaseSource interface {
	Lease(ctx context.Context, id string) (api.Lease, error)
}

// AttachConfig says how Attach serves a lease.
type AttachConfig struct {
	// Listen is where the volume is served: a loopback TCP address
	// ("127.0.0.1:0" when empty) or "unix:/path/to/socket".
	Listen string
	// StripeUnit overrides a composed block lease's stripe unit; 0 means
	// the lease's.
	StripeUnit int64
	// ConnsPerPart is the number of NBD connections to each part of a
	// block lease; 0 means stripe.DefaultConnsPerPart.
	ConnsPerPart int
	// RequestTimeout bounds every request to a part (a part that misses it
	// is declared failed) and, for a memory lease, every request to the
	// donor; 0 means the data plane's default.
	RequestTimeout time.Duration
	// TLS, if set, returns the client configuration for the lease's URIs
	// that ask for TLS (nbds://, rialto-mems://): normally one that trusts
	// the cluster CA's certificates (RIALTO_CACERT: pki.LoadClientTLS, or
	// pki.Roots.ClientTLS for the certificates in use as they change).
	// A block lease's parts call it at each dial, their redials included;
	// a memory lease's session when it opens and when it follows the
	// lease (a move, its donor lost). Nil trusts the system's
	// CAs. URIs in plaintext ignore it: the lease, as the control plane
	// handed it out, says how each part is reached.
	TLS func() *tls.Config
	// Track, if set, is handed each TLS connection to a block lease's
	// parts (stripe.AttachConfig.Track) and of a memory lease's session
	// (client.Options.Track): normally the Tracker of the revocation
	// list TLS checks lenders with (pki.Roots.Tracker), so that a
	// connection to a lender whose certificate a later list revokes ends
	// then, rather than when it breaks; the part is given up, and the
	// memory session not opened there again, unless the lease moved.
	Track pki.TrackFunc
	// WriteBack acknowledges a block lease's plain writes once sent to
	// their lenders, before their replies (a volatile write cache that
	// FLUSH and FUA make durable: stripe.ServeConfig.WriteBack); false
	// waits for the lenders.
	WriteBack bool
	// Logger receives attachment events; nil discards them.
	Logger *slog.Logger
}

// StaticTLS is an AttachConfig.TLS that always returns cfg (nil: none).
func StaticTLS(cfg *tls.Config) func() *tls.Config {
	if cfg == nil {
		return nil
	}
	return func() *tls.Config { return cfg }
}

// AttachParts checks what Attach can check of lease l without dialling and
// returns the number of parts Attach serves it from. A memory lease is one
// part (Attach checks it).
func AttachParts(l api.Lease) (int, error) {
	if l.Kind == api.KindMemory {
		return 1, nil
	}
	uris, err := BlockURIs(l)
	return len(uris), err
}

// BlockURIs returns the NBD URIs of active block lease l's parts in
// layout order (a lease of one part may carry its URI on the lease only).
func BlockURIs(l api.Lease) ([]string, error) {
	if l.Kind != api.KindBlock {
		return nil, fmt.Errorf("lease %s is %s %s lease; attach serves block and memory leases", l.ID, l.Kind.Article(), l.Kind)
	}
	if l.State != api.LeaseActive {
		return nil, fmt.Errorf("lease %s is %s, not active", l.ID, l.State)
	}
	var uris []string
	for i, p := range l.Parts {
		if p.URI == "" {
			if len(l.Parts) == 1 && l.URI != "" {
				break
			}
			return nil, fmt.Errorf("lease %s: part %d has no URI", l.ID, i)
		}
		uris = append(uris, p.URI)
	}
	if len(uris) == 0 && l.URI != "" {
		uris = []string{l.URI}
	}
	if len(uris) == 0 {
		return nil, fmt.Errorf("lease %s has no URI", l.ID)
	}
	return uris, nil
}

// Attach serves active lease l locally as one NBD export until the
// Attachment is closed: a block lease's parts (one, or a composed lease's
// stripes) dialled over NBD, or a memory lease's region over the memory
// protocol (see AttachMemory). ctx bounds the dialling only.
//
// A block part whose lender restarted at another address, or that moved
// to another lender (rialto lease move, a drain), is followed: while
// redialling it fails, Attach asks src for the lease's current record and
// dials the URI the control plane has for the part now. A nil src redials
// the URI the part was attached with. A memory lease that moved is
// followed the same way: its session at the old donor ends, and Attach
// opens one where the lease now is and retries the request.
func Attach(ctx context.Context, src LeaseSource, l api.Lease, cfg AttachConfig) (*stripe.Attachment, error) {
	if l.Kind == api.KindMemory {
		return attachMemory(ctx, src, l, cfg)
	}
	scfg, err := stripeConfig(src, l, cfg)
	if err != nil {
		return nil, err
	}
	return stripe.Attach(ctx, scfg)
}

// OpenVolume dials active block lease l's parts as Attach does and returns
// the volume, not served (cfg.Listen and cfg.WriteBack are ignored): the
// caller serves it some other way, e.g. as a FUSE file, and closes it.
func OpenVolume(ctx context.Context, src LeaseSource, l api.Lease, cfg AttachConfig) (*stripe.Volume, error) {
	scfg, err := stripeConfig(src, l, cfg)
	if err != nil {
		return nil, err
	}
	return stripe.Dial(ctx, scfg)
}

// stripeConfig is how block lease l is attached.
func stripeConfig(src LeaseSource, l api.Lease, cfg AttachConfig) (stripe.AttachConfig, error) {
	uris, err := BlockURIs(l)
	if err != nil {
		return stripe.AttachConfig{}, err
	}
	su := cfg.StripeUnit
	if su == 0 {
		su = l.StripeUnit
	}
	var resolve func(ctx context.Context, part int) (string, error)
	if src != nil {
		resolve = func(ctx context.Context, part int) (string, error) {
			return movedPart(ctx, src, l.ID, part)
		}
	}
	return stripe.AttachConfig{URIs: uris, StripeUnit: su, Listen: cfg.Listen, TLS: cfg.TLS, Track: cfg.Track,
		ConnsPerPart: cfg.ConnsPerPart, RequestTimeout: cfg.RequestTimeout, Resolve: resolve, WriteBack: cfg.WriteBack, Logger: cfg.Logger}, nil
}

// movedPart returns the URI the control plane has now for part of block
// lease id. A lease that ended (or that the control plane no longer
// knows) is stripe.ErrPartEnded: its parts are not redialled further.
func movedPart(ctx context.Context, src LeaseSource, id string, part int) (string, error) {
	cur, err := src.Lease(ctx, id)
	if api.IsCode(err, api.CodeNotFound) {
		return "", fmt.Errorf("%w: lease %s is gone: %w", stripe.ErrPartEnded, id, err)
	}
	if err != nil {
		return "", err
	}
	if cur.State.Terminal() {
		why := ""
		if cur.Reason != "" {
			why = " (" + cur.Reason + ")"
		}
		return "", fmt.Errorf("%w: lease %s is %s%s", stripe.ErrPartEnded, id, cur.State, why)
	}
	us, err := BlockURIs(cur)
	if err != nil {
		return "", err
	}
	if part >= len(us) {
		return "", fmt.Errorf("lease %s has %d parts now", id, len(us))
	}
	return us[part], nil
}
