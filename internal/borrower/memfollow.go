package borrower

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
)

// A memory lease that moves to another donor (rialto lease move, a drain)
// is followed by every session Rialto's borrower opens on it: at the
// switch the old donor answers GONE and closes the session, and the
// session (a client.Following) asks src for the lease's current URI,
// opens a session there and retries the request. Reads and writes of
// whole ranges are idempotent. A mapping on such a session follows too
// (mapping.Follower).

// relocator is the client.Relocator of part of memory lease id: the URI
// src has for it now. A lease that ended, or that src does not know,
// stops the follow (client.ErrEnded); without src there is nothing to
// follow.
func relocator(src LeaseSource, id string, part int) client.Relocator {
	return func(ctx context.Context) (string, string, error) {
		if src == nil {
			return "", "", fmt.Errorf("%w: lease %s is not followed (no lease source)", client.ErrEnded, id)
		}
		l, err := src.Lease(ctx, id)
		if api.IsCode(err, api.CodeNotFound) {
			return "", "", fmt.Errorf("%w: lease %s is gone", client.ErrEnded, id)
		}
		if err != nil {
			return "", "", err
		}
		if l.State != api.LeaseActive {
			return "", "", fmt.Errorf("%w: lease %s is %s", client.ErrEnded, id, l.State)
		}
		us, err := MemoryURIs(l)
		if err != nil {
			return "", "", err
		}
		if part >= len(us) {
			return "", "", fmt.Errorf("%w: lease %s has %d part(s) now", client.ErrEnded, id, len(us))
		}
		return us[part].Address, us[part].Credential, nil
	}
}

// FollowMemory opens a session with the donor region of part of memory
// lease l (see MemoryURIs) that follows the region when the lease moves,
// asking src where it is (nil src: it does not follow). The donor admits
// one session per region at a time.
func FollowMemory(ctx context.Context, src LeaseSource, l api.Lease, part int, opts client.Options, log *slog.Logger) (*client.Following, error) {
	return followMemory(ctx, src, l, part, opts, nil, log)
}

// followMemory is FollowMemory whose follows, if tlsFor is set, dial a
// session over TLS with the configuration it returns then
// (client.FollowConfig.TLS; AttachConfig.TLS).
func followMemory(ctx context.Context, src LeaseSource, l api.Lease, part int, opts client.Options, tlsFor func() *tls.Config, log *slog.Logger) (*client.Following, error) {
	uris, err := MemoryURIs(l)
	if err != nil {
		return nil, err
	}
	if part < 0 || part >= len(uris) {
		return nil, fmt.Errorf("lease %s has %d part(s), not a part %d", l.ID, len(uris), part)
	}
	// opts.TLS applies if the part's URI asks for TLS (rialto-mems://); the
	// follows dial the region's new place with the same options.
	f, err := client.DialFollowing(ctx, uris[part].Address, uris[part].Credential, dialOptions(uris[part], opts),
		client.FollowConfig{Relocate: relocator(src, l.ID, part), TLS: tlsFor, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("lease %s part %d: %w", l.ID, part, err)
	}
	return f, nil
}

// memDevice is a memory lease seen as a block device (Venice's remote
// memory as swap), over a session that follows the lease when it moves.
// Closing the device ends the session.
type memDevice struct{ f *client.Following }

func (d *memDevice) Size() int64 { return d.f.Size() }

// ReadAt reads from the region; a read past the end is short with io.EOF.
func (d *memDevice) ReadAt(p []byte, off int64) (int, error) { return d.f.ReadAt(p, off) }

// WriteAt writes to the region; writes past the end fail.
func (d *memDevice) WriteAt(p []byte, off int64) (int, error) { return d.f.WriteAt(p, off) }

// Flush has nothing to do: an acknowledged write is in the donor's memory.
func (d *memDevice) Flush() error { return nil }

func (d *memDevice) Close() error { return d.f.Close() }

// MultiConnSafe: the donor's memory is as durable as it gets.
func (d *memDevice) MultiConnSafe() bool { return true }
