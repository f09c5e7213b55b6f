package agent

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// Memory parts move page by page over the memory protocol: the
// destination reserves a region reachable with the transfer's token; the
// source reads its region and writes every page that is not all zeroes
// (the destination's region is fresh anonymous memory, zero already) over
// the bulk channel; its donor marks the pages the borrower's WRITEs change
// in a dirty map, holds them for the last pass and, at the commit, ends the
// borrower's session (held writes are answered "gone"); the destination
// then serves the region under the lease's credential. The source's
// session with the destination's region carries the region's generation
// (protocol.MoveGeneration), which the region takes when it is served as
// the lease's: the moved region is the same region to a borrower that
// comes back to a place it knew (docs/memory-protocol.md, "Region
// generation"). A destination that predates it keeps a generation of its
// own; a source that predates it carries none.

var _ Mover = (*MemoryDriver)(nil)

// ReceiveMove reserves a region for e reachable with token.
func (m *MemoryDriver) ReceiveMove(_ context.Context, e Export, token string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live[e.Request.Export] {
		return "", fmt.Errorf("%w: the part's export exists", ErrConflict)
	}
	if err := m.donor.ReceiveRegion(token, e.Request.Length); err != nil {
		return "", err
	}
	m.live[e.Request.Export] = true
	m.incoming[e.Request.Export] = token
	return protocol.URI{Address: e.Endpoint, Credential: token, TLS: m.tls}.String(), nil
}

// ActivateMove serves the received region under the lease's credential,
// its requests refused from the export's known expiry on (e.deadline);
// with e.suspended, the region is suspended first (as Suspend leaves it:
// it takes no connection, under either credential, until Resume), and
// without, it is resumed (a failed commit before may have suspended it).
func (m *MemoryDriver) ActivateMove(_ context.Context, e Export) (api.PrepareResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	uri := protocol.URI{Address: e.Endpoint, Credential: e.Request.Export, TLS: m.tls}.String()
	tok, ok := m.incoming[e.Request.Export]
	if !ok {
		if m.live[e.Request.Export] {
			// Activated already (a commit tried again): served, or not,
			// as this commit says.
			change := m.donor.ResumeRegion
			if e.suspended {
				change = m.donor.SuspendRegion
			}
			if err := m.donor.SetRegionDeadline(e.Request.Export, e.deadline); err != nil {
				return api.PrepareResponse{}, fmt.Errorf("agent: serve or suspend the moved part: %w", err)
			}
			if err := change(e.Request.Export); err != nil {
				return api.PrepareResponse{}, fmt.Errorf("agent: serve or suspend the moved part: %w", err)
			}
			return api.PrepareResponse{URI: uri}, nil
		}
		return api.PrepareResponse{}, fmt.Errorf("%w: the part was not received", ErrNoDevice)
	}
	if e.suspended {
		if err := m.donor.SuspendRegion(tok); err != nil {
			return api.PrepareResponse{}, fmt.Errorf("agent: suspend the moved part: %w", err)
		}
	}
	// Before it is served as the lease's: the move's source wrote to
	// it with no deadline.
	if err := m.donor.SetRegionDeadline(tok, e.deadline); err != nil {
		return api.PrepareResponse{}, fmt.Errorf("agent: serve the moved part: %w", err)
	}
	if err := m.donor.ActivateRegion(tok, e.Request.Export); err != nil {
		return api.PrepareResponse{}, err
	}
	delete(m.incoming, e.Request.Export)
	if !e.suspended {
		// A commit before this one, with no time left, may have
		// suspended the region and failed after: the region is
		// suspended still, which a commit with time left undoes. (It
		// resumes the region under the lease's credential only: the
		// token's connections do not come back.)
		if err := m.donor.ResumeRegion(e.Request.Export); err != nil {
			return api.PrepareResponse{}, fmt.Errorf("agent: resume the moved region: %w", err)
		}
	}
	return api.PrepareResponse{URI: uri}, nil
}

// SendMove starts marking the pages the borrower writes.
func (m *MemoryDriver) SendMove(ctx context.Context, e Export) (MoveSource, error) {
	m.mu.Lock()
	live := m.live[e.Request.Export]
	_, in := m.incoming[e.Request.Export]
	m.mu.Unlock()
	if !live || in {
		return nil, fmt.Errorf("%w: the region is not served", ErrTransferState)
	}
	cred := e.Request.Export
	size, err := m.donor.RegionSize(cred)
	if err != nil {
		return nil, err
	}
	d := dirty.New(size, int64(os.Getpagesize()))
	if err := m.donor.TrackWrites(ctx, cred, d); err != nil {
		m.donor.EndMove(cred)
		return nil, err
	}
	return &memorySource{d: m.donor, cred: cred, size: size, dirty: d}, nil
}

// DialMove opens a session with the destination's region: over TLS,
// verified against the cluster CA, if the destination serves
// rialto-mems://, its connections registered with the revocation list
// (UseTLS's track: a list the agent takes during the move that revokes
// the destination's certificate ends the session, and the copy's writes
// fail with an error wrapping pki.ErrRevoked). Its HELLO carries the generation of e's region, which
// the destination's region takes when it is activated.
func (m *MemoryDriver) DialMove(ctx context.Context, e Export, uri string) (MoveDest, error) {
	u, err := protocol.ParseURI(uri)
	if err != nil {
		return nil, fmt.Errorf("agent: destination: %w", err)
	}
	gen, err := m.donor.RegionGeneration(e.Request.Export)
	if err != nil {
		return nil, fmt.Errorf("agent: the region to move: %w", err)
	}
	opts := memclient.Options{Timeout: moveRequestTimeout, MoveGeneration: gen}
	if u.TLS {
		m.mu.Lock()
		cli, track := m.cli, m.track
		m.mu.Unlock()
		if cli == nil {
			return nil, errNoCA
		}
		opts.TLS, opts.Track = cli(), track
	}
	c, err := memclient.Dial(ctx, u.Address, u.Credential, opts)
	if err != nil {
		return nil, err
	}
	return memoryDest{c}, nil
}

// memorySource is a memory part moving from here.
type memorySource struct {
	d       *donor.Donor
	cred    string
	size    int64
	dirty   *dirty.Map
	retired bool
}

func (s *memorySource) Size() int64 { return s.size }

// Layout: the region is all data; pages of zeroes are found as they are
// read.
func (s *memorySource) Layout() ([]Span, error) { return []Span{{Off: 0, Len: s.size}}, nil }

func (s *memorySource) ReadAt(p []byte, off int64) (int, error) {
	return s.d.ReadRegion(s.cred, p, off)
}

func (s *memorySource) Take() []dirty.Range { return s.dirty.Take() }
func (s *memorySource) Dirty() int64        { return s.dirty.Bytes() }

func (s *memorySource) PauseWrites(ctx context.Context) error {
	return s.d.PauseWrites(ctx, s.cred)
}

func (s *memorySource) ResumeWrites() error { return s.d.ResumeWrites(s.cred) }

func (s *memorySource) Retire(ctx context.Context) error {
	s.retired = true
	return s.d.RetireRegion(ctx, s.cred)
}

func (s *memorySource) Close() error {
	if s.retired {
		return nil
	}
	if err := s.d.EndMove(s.cred); err != nil && !errors.Is(err, donor.ErrNoRegion) {
		return err
	}
	return nil
}

// memoryDest is the destination's region, as the source writes it.
type memoryDest struct{ c *memclient.Client }

func (d memoryDest) WriteAt(ctx context.Context, p []byte, off int64) error {
	return d.c.Write(ctx, memclient.ChannelBulk, p, off)
}

// FreshZero: the destination's region is fresh anonymous memory, zero
// until written, so the first pass sends nothing for pages of zeroes.
func (d memoryDest) FreshZero() bool { return true }

// Zero writes zeroes (a page zeroed after it was copied).
func (d memoryDest) Zero(ctx context.Context, off, n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeroChunk)))
		if err := d.c.Write(ctx, memclient.ChannelBulk, zeroChunk[:k], off); err != nil {
			return err
		}
		off += k
		n -= k
	}
	return nil
}

func (d memoryDest) Flush(context.Context) error { return nil }
func (d memoryDest) Close() error                { return d.c.Close() }
