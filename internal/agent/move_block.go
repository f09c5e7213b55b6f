package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/dirty"
)

// Block parts move over NBD: the destination serves the received range as
// a writable export named by the transfer's token; the source reads its
// own file (the range's allocation map tells which parts are holes) and
// writes to that export, holes as WRITE_ZEROES; its NBD server marks the
// borrower's writes in a dirty map of 4 KiB chunks, holds them for the
// last pass and retires the old export at the commit (see
// nbd.Server.Retire).

// dirtyChunk is the granularity of a moving block part's dirty map.
const dirtyChunk = 4 << 10

// moveRequestTimeout bounds one request of the copy to the destination.
const moveRequestTimeout = 60 * time.Second

var _ Mover = (*BlockDriver)(nil)

// ReceiveMove serves e's range as a writable export named token.
func (b *BlockDriver) ReceiveMove(_ context.Context, e Export, token string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.live[e.Request.Export]; ok {
		return "", fmt.Errorf("%w: the part's export exists", ErrConflict)
	}
	if !b.paths[e.Device.Path] {
		return "", fmt.Errorf("%w: %s is not open", ErrNoDevice, e.Device.Name)
	}
	be, err := nbd.OpenFile(e.Device.Path, nbd.FileOptions{Offset: e.Request.Offset, Length: e.Request.Length})
	if err != nil {
		return "", err
	}
	if err := b.srv.AddExport(nbd.Export{Name: token, Backend: be, Description: "rialto transfer of lease " + e.Request.LeaseID}); err != nil {
		be.Close()
		return "", err
	}
	// Served as a prepare would serve it (its device's counters, its
	// caps) once the commit activates it; the copy to the token's export
	// is neither counted nor capped.
	b.live[e.Request.Export] = &blockExport{ex: b.leaseExportLocked(e, be), be: be, incoming: token}
	return b.scheme + "://" + e.Endpoint + "/" + token, nil
}

// ActivateMove serves the part's export and stops serving the token's;
// with e.suspended, the part's export is registered suspended (as
// Suspend leaves it: no client opens it until Resume). One that fails
// leaves the part as received.
func (b *BlockDriver) ActivateMove(_ context.Context, e Export) (api.PrepareResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	uri := b.scheme + "://" + e.Endpoint + "/" + e.Request.Export
	x, ok := b.live[e.Request.Export]
	if !ok {
		return api.PrepareResponse{}, fmt.Errorf("%w: the part was not received", ErrNoDevice)
	}
	if x.incoming == "" {
		// Activated already (a commit tried again): served, or not, as
		// this commit says.
		switch {
		case x.retired || e.suspended == x.suspended:
		case e.suspended:
			if err := b.srv.SuspendExport(x.ex.Name); err != nil {
				return api.PrepareResponse{}, fmt.Errorf("agent: suspend the moved part: %w", err)
			}
			x.suspended = true
		default:
			if err := b.srv.ResumeExport(x.ex.Name); err != nil {
				return api.PrepareResponse{}, fmt.Errorf("agent: serve the moved part: %w", err)
			}
			x.suspended = false
		}
		return api.PrepareResponse{URI: uri}, nil
	}
	// The part's export is added first, and x records it only once it
	// is: an add that fails leaves the part as it was received (the
	// token's export served, x unchanged), and a commit tried again adds
	// it. (Removed first, a failed add left neither served, and x saying
	// activated: the next commit answered the URI of nothing.) Nobody
	// knows the part's URI before the commit answers, and the token's
	// export is gone when it does.
	add := b.srv.AddExport
	if e.suspended {
		add = b.srv.AddSuspendedExport
	}
	if err := add(x.ex); err != nil {
		return api.PrepareResponse{}, err
	}
	if err := b.srv.RemoveExport(x.incoming); err != nil && !errors.Is(err, nbd.ErrExportNotFound) {
		if rerr := b.srv.RemoveExport(x.ex.Name); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return api.PrepareResponse{}, fmt.Errorf("agent: stop serving the transfer's export: %w", err)
	}
	x.incoming, x.suspended = "", e.suspended
	return api.PrepareResponse{URI: uri}, nil
}

// SendMove starts marking the writes to e's export.
func (b *BlockDriver) SendMove(ctx context.Context, e Export) (MoveSource, error) {
	b.mu.Lock()
	x, ok := b.live[e.Request.Export]
	ok = ok && !x.suspended && x.registered() == e.Request.Export
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: the export is not served", ErrTransferState)
	}
	d := dirty.New(x.be.Size(), dirtyChunk)
	if err := b.srv.TrackWrites(ctx, x.ex.Name, d); err != nil {
		b.srv.EndMove(x.ex.Name)
		return nil, err
	}
	return &blockSource{b: b, x: x, d: d}, nil
}

// DialMove connects to the destination's export: over TLS, verified
// against the cluster CA (and its revocation list), if the destination
// serves nbds://. That connection is registered with the revocation list
// (UseTLS's track): a list the agent takes during the move that revokes
// the destination's certificate ends it, and the copy's requests fail
// with an error wrapping pki.ErrRevoked (the move fails saying the
// destination's certificate is revoked).
func (b *BlockDriver) DialMove(ctx context.Context, _ Export, uri string) (MoveDest, error) {
	opts := []nbd.DialOption{nbd.WithRequestTimeout(moveRequestTimeout)}
	u, err := nbd.ParseURI(uri)
	if err != nil {
		return nil, fmt.Errorf("agent: destination: %w", err)
	}
	if u.TLS {
		b.mu.Lock()
		cfg, track := b.cliTLS, b.track
		b.mu.Unlock()
		if cfg == nil {
			return nil, errNoCA
		}
		opts = append(opts, nbd.WithTLS(cfg()), nbd.WithTrack(track))
	}
	c, err := nbd.DialURI(ctx, uri, opts...)
	if err != nil {
		return nil, err
	}
	return blockDest{c}, nil
}

// blockSource is a block part moving from here.
type blockSource struct {
	b *BlockDriver
	x *blockExport
	d *dirty.Map
}

func (s *blockSource) Size() int64 { return s.x.be.Size() }

func (s *blockSource) ReadAt(p []byte, off int64) (int, error) { return s.x.be.ReadAt(p, off) }

// Layout is the file's allocation map over the range (a hole reads as
// zeroes).
func (s *blockSource) Layout() ([]Span, error) {
	var out []Span
	size := s.x.be.Size()
	for off := int64(0); off < size; {
		exts, err := s.x.be.Extents(off, size-off)
		if err != nil {
			return nil, err
		}
		for _, x := range exts {
			if x.Length <= 0 || off >= size {
				break
			}
			n := min(x.Length, size-off)
			zero := x.Flags&nbd.StateZero != 0
			if k := len(out) - 1; k >= 0 && out[k].Zero == zero && out[k].Off+out[k].Len == off {
				out[k].Len += n
			} else {
				out = append(out, Span{Off: off, Len: n, Zero: zero})
			}
			off += n
		}
	}
	return out, nil
}

// movePending sums the payload bytes of the borrowers' writes the moving
// parts' exports hold in memory (nbd.Server.MovePending bounds each).
func (b *BlockDriver) movePending() int64 {
	b.mu.Lock()
	names := make([]string, 0, len(b.live))
	for _, x := range b.live {
		if n := x.registered(); n != "" && x.incoming == "" {
			names = append(names, n)
		}
	}
	b.mu.Unlock()
	var sum int64
	for _, n := range names {
		if st, ok := b.srv.MoveStats(n); ok {
			sum += st.Pending
		}
	}
	return sum
}

func (s *blockSource) Take() []dirty.Range { return s.d.Take() }
func (s *blockSource) Dirty() int64        { return s.d.Bytes() }

func (s *blockSource) PauseWrites(ctx context.Context) error {
	return s.b.srv.PauseWrites(ctx, s.x.ex.Name)
}

func (s *blockSource) ResumeWrites() error { return s.b.srv.ResumeWrites(s.x.ex.Name) }

// Retire retires the export from the server; the driver's Teardown then
// only closes the backend.
func (s *blockSource) Retire(ctx context.Context) error {
	s.b.mu.Lock()
	s.x.retired = true
	s.b.mu.Unlock()
	return s.b.srv.Retire(ctx, s.x.ex.Name)
}

func (s *blockSource) Close() error {
	s.b.mu.Lock()
	retired := s.x.retired
	s.b.mu.Unlock()
	if retired {
		return nil
	}
	if err := s.b.srv.EndMove(s.x.ex.Name); err != nil && !errors.Is(err, nbd.ErrExportNotFound) {
		return err
	}
	return nil
}

// blockDest is the destination's export, as the source writes it.
type blockDest struct{ c *nbd.Client }

func (d blockDest) WriteAt(ctx context.Context, p []byte, off int64) error {
	_, err := d.c.WriteAtContext(ctx, p, off, false)
	return err
}

func (d blockDest) Zero(ctx context.Context, off, n int64) error {
	return d.c.WriteZeroesContext(ctx, off, n, false)
}

func (d blockDest) Flush(ctx context.Context) error { return d.c.FlushContext(ctx) }
func (d blockDest) Close() error                    { return d.c.Close() }
