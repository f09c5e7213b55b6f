package stripe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/pki"
)

// OpenConfig describes a volume to open for direct use (not served).
type OpenConfig struct {
	// URIs are the parts in layout order (nbd:// or nbd+unix://, or their
	// TLS forms); their export names are credentials, never logged or
	// quoted in errors.
	URIs []string
	// TLS is as in AttachConfig.
	TLS *tls.Config
	// Track, if set, is handed each TLS connection to a part
	// (nbd.WithTrack), as in AttachConfig: a revocation list's Tracker
	// ends the connections to a part whose lender's certificate a list
	// it takes later revokes, and the volume's requests to that part
	// fail (nothing is redialled).
	Track pki.TrackFunc
	// StripeUnit as in Config; 0 means DefaultStripeUnit. Ignored for one
	// part, where the layout is the identity (the volume is the part,
	// rounded down to a multiple of MinStripeUnit).
	StripeUnit int64
	// ConnsPerPart is the number of connections to each part; 0 means 1.
	ConnsPerPart int
	// RequestTimeout as in Config.
	RequestTimeout time.Duration
	// Check, if set, is called for each part before it is dialled and may
	// refuse it or rewrite its address (say, to the IP address it checked).
	// Its error should name the part by index and address only.
	Check  func(ctx context.Context, part int, u nbd.URI) (nbd.URI, error)
	Logger *slog.Logger
}

// Open dials every part (concurrently) and returns the Volume over them:
// ReadAt and WriteAt of the volume go to each stripe's own part with the
// layout Attach uses, so a reader of the volume sees the bytes a borrower
// wrote through `rialto attach`. Closing the Volume closes the connections.
// ctx bounds the dialling only.
func Open(ctx context.Context, cfg OpenConfig) (*Volume, error) {
	if len(cfg.URIs) == 0 {
		return nil, fmt.Errorf("%w: no parts", ErrConfig)
	}
	conns := max(cfg.ConnsPerPart, 1)
	timeout := cfg.RequestTimeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	uris := make([]nbd.URI, len(cfg.URIs))
	for i, s := range cfg.URIs {
		u, err := nbd.ParseURI(s)
		if err != nil {
			return nil, fmt.Errorf("%w: part %d: malformed NBD URI", ErrConfig, i)
		}
		if cfg.Check != nil {
			if u, err = cfg.Check(ctx, i, u); err != nil {
				return nil, err
			}
		}
		uris[i] = u
	}
	clients := make([]*nbd.Client, len(uris)*conns)
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, u := range uris {
		for j := range conns {
			wg.Go(func() {
				c, err := u.Dial(ctx, cfg.TLS, nbd.WithRequestTimeout(timeout), nbd.WithTrack(cfg.Track))
				if err != nil {
					errs[i*conns+j] = fmt.Errorf("stripe: part %d (%s): %w", i, u.Address, err)
					return
				}
				clients[i*conns+j] = c
			})
		}
	}
	wg.Wait()
	closeAll := func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		closeAll()
		return nil, err
	}
	devs := make([]Device, len(uris))
	for i := range uris {
		cs := clients[i*conns : (i+1)*conns]
		if conns == 1 {
			devs[i] = cs[0]
			continue
		}
		ps := make([]Device, conns)
		for j, c := range cs {
			ps[j] = c
		}
		p, err := NewPool(ps...)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("stripe: part %d: %w", i, err)
		}
		devs[i] = p
	}
	unit := cfg.StripeUnit
	if len(devs) == 1 {
		// One part: the layout is the identity whatever the unit, and the
		// smallest unit loses the least of a size that is not a multiple.
		unit = MinStripeUnit
	}
	vol, err := New(devs, Config{StripeUnit: unit, RequestTimeout: timeout, Logger: cfg.Logger})
	if err != nil {
		closeAll()
		return nil, err
	}
	return vol, nil
}
