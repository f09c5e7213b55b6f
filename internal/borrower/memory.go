package borrower

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// AttachMemory serves active memory lease l, of one part, as a local NBD
// export backed by the donor's memory: a swap-style block device any NBD
// client can use. Attach calls it for memory leases, and then follows the
// lease when it moves (memfollow.go); AttachMemory does not. The donor
// admits one subscriber at a time: while the attachment lives, nothing
// else can dial the lease.
func AttachMemory(ctx context.Context, l api.Lease, cfg AttachConfig) (*stripe.Attachment, error) {
	return attachMemory(ctx, nil, l, cfg)
}

func attachMemory(ctx context.Context, src LeaseSource, l api.Lease, cfg AttachConfig) (*stripe.Attachment, error) {
	if l.State != api.LeaseActive {
		return nil, fmt.Errorf("lease %s is %s, not active", l.ID, l.State)
	}
	uri := l.URI
	if uri == "" && len(l.Parts) == 1 {
		uri = l.Parts[0].URI
	}
	if len(l.Parts) > 1 || uri == "" {
		return nil, fmt.Errorf("lease %s: attach serves memory leases of one part with a URI", l.ID)
	}
	if _, err := protocol.ParseURI(uri); err != nil {
		return nil, fmt.Errorf("lease %s: %w", l.ID, err)
	}
	// cfg.TLS is the configuration for TLS URIs: the session uses it if
	// the lease's URI asks for TLS, and so do its follows when it moves
	// (what it returns then).
	var tc *tls.Config
	if cfg.TLS != nil {
		tc = cfg.TLS()
	}
	f, err := followMemory(ctx, src, l, 0, client.Options{Timeout: cfg.RequestTimeout, TLS: tc, Track: cfg.Track}, cfg.TLS, cfg.Logger)
	if err != nil {
		return nil, err
	}
	dev := &memDevice{f: f}
	vol, err := stripe.New([]stripe.Device{dev}, stripe.Config{RequestTimeout: cfg.RequestTimeout, Logger: cfg.Logger})
	if err != nil {
		dev.Close()
		return nil, err
	}
	att, err := stripe.Serve(ctx, vol, stripe.ServeConfig{Listen: cfg.Listen, Logger: cfg.Logger})
	if err != nil {
		vol.Close()
		return nil, err
	}
	return att, nil
}

// MemoryURIs returns the URIs of memory lease l's parts, in order (the
// lease's own URI when its parts carry none).
func MemoryURIs(l api.Lease) ([]protocol.URI, error) {
	var raw []string
	for _, p := range l.Parts {
		if p.URI != "" {
			raw = append(raw, p.URI)
		}
	}
	if len(raw) == 0 && l.URI != "" {
		raw = []string{l.URI}
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("lease %s has no URI", l.ID)
	}
	uris := make([]protocol.URI, len(raw))
	for i, s := range raw {
		u, err := protocol.ParseURI(s)
		if err != nil {
			return nil, fmt.Errorf("lease %s part %d: %w", l.ID, i, err)
		}
		uris[i] = u
	}
	return uris, nil
}

// dialOptions is opts for dialling u: its TLS configuration applies only
// if u asks for TLS (see memoryTLS).
func dialOptions(u protocol.URI, opts client.Options) client.Options {
	opts.TLS = memoryTLS(u, opts.TLS)
	return opts
}

// memoryTLS is the client configuration for memory URI u: cfg (or the
// system's CAs) if u asks for TLS, none otherwise.
func memoryTLS(u protocol.URI, cfg *tls.Config) *tls.Config {
	if !u.TLS {
		return nil
	}
	if cfg == nil {
		return &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return cfg
}

// DialMemory opens a session with the donor region of part of memory lease
// l (see MemoryURIs). The donor admits one session per region at a time.
// opts.TLS is used if the part's URI asks for TLS (rialto-mems://; nil
// then trusts the system's CAs) and ignored otherwise.
func DialMemory(ctx context.Context, l api.Lease, part int, opts client.Options) (*client.Client, error) {
	uris, err := MemoryURIs(l)
	if err != nil {
		return nil, err
	}
	if part < 0 || part >= len(uris) {
		return nil, fmt.Errorf("lease %s has %d part(s), not a part %d", l.ID, len(uris), part)
	}
	opts.TLS = memoryTLS(uris[part], opts.TLS)
	c, err := client.Dial(ctx, uris[part].Address, uris[part].Credential, opts)
	if err != nil {
		return nil, fmt.Errorf("lease %s part %d: %w", l.ID, part, err)
	}
	return c, nil
}

// MemoryMapping is a part of a memory lease mapped into this process: its
// Mapping's Bytes are ordinary memory backed by the donor's region.
type MemoryMapping struct {
	*mapping.Mapping
	// Session is the session the mapping rides on: it follows the lease
	// when it moves, and the mapping with it.
	Session *client.Following
}

// MapMemory dials part of memory lease l and maps its region (see
// mapping.Map: the program's main must call mapping.RunFaultHandlerIfChild
// first). The mapping follows the lease when it moves to another donor:
// it asks src where the lease is then (nil src: it ends with the old
// region, as a plain session does), and a touch of its memory never sees
// the switch. It fails with an error wrapping mapping.ErrUffdUnavailable
// where userfaultfd is refused; DialMemory's explicit channels work there.
func MapMemory(ctx context.Context, src LeaseSource, l api.Lease, part int, copts client.Options, mopts mapping.Options) (*MemoryMapping, error) {
	f, err := FollowMemory(ctx, src, l, part, copts, nil)
	if err != nil {
		return nil, err
	}
	m, err := mapping.Map(ctx, f, mopts)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lease %s part %d: %w", l.ID, part, err)
	}
	return &MemoryMapping{Mapping: m, Session: f}, nil
}

// Close flushes the mapping's dirty pages, unmaps it and ends the session
// (the mapping first, as its lifetime requires).
func (m *MemoryMapping) Close() error {
	return errors.Join(m.Mapping.Close(), m.Session.Close())
}
