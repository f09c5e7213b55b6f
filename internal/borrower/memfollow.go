package borrower

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// memDevice is a memory lease seen as a block device (Venice's remote
// memory as swap), over one session with the donor. When the session
// ends because the lease moved (the old donor answers "gone" or drops the
// connection), a request asks src for the lease's current URI, opens a
// session there and is retried once: reads and writes of whole ranges are
// idempotent. Without src, or while the lease's URI has not changed, the
// error stands. Closing the device ends the session.
type memDevice struct {
	src     LeaseSource
	leaseID string
	opts    client.Options
	log     *slog.Logger

	mu  sync.Mutex // serialises follows; guards the fields below
	c   *client.Client
	b   *client.Backend
	uri protocol.URI
	gen int
	// closed: Close ran; no session is opened any more.
	closed bool
}

// followTimeout bounds how long a request waits for the lease's new URI.
const followTimeout = 10 * time.Second

func newMemDevice(c *client.Client, u protocol.URI, opts client.Options, src LeaseSource, leaseID string, log *slog.Logger) *memDevice {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &memDevice{src: src, leaseID: leaseID, opts: opts, log: log, c: c, b: client.NewBackend(c), uri: u}
}

func (d *memDevice) cur() (*client.Backend, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.b, d.gen
}

// call runs f on the current session, following the lease once if the
// session ended.
func (d *memDevice) call(f func(b *client.Backend) error) error {
	b, gen := d.cur()
	err := f(b)
	if err == nil || d.src == nil || !(errors.Is(err, protocol.ErrGone) || errors.Is(err, protocol.ErrDonorLost)) {
		return err
	}
	nb, ferr := d.follow(gen)
	if ferr != nil {
		return errors.Join(err, ferr)
	}
	return f(nb)
}

// follow opens a session where the lease is now, unless another call has
// since generation gen.
func (d *memDevice) follow(gen int) (*client.Backend, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, protocol.ErrClosed
	}
	if d.gen != gen {
		return d.b, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), followTimeout)
	defer cancel()
	wait := 20 * time.Millisecond
	for {
		u, err := d.resolve(ctx)
		if err == nil && u != d.uri {
			c, derr := client.Dial(ctx, u.Address, u.Credential, dialOptions(u, d.opts))
			if derr == nil {
				if c.Size() != d.c.Size() {
					c.Close()
					return nil, fmt.Errorf("lease %s: the moved region has %d bytes, not %d", d.leaseID, c.Size(), d.c.Size())
				}
				d.c.Close()
				d.c, d.b, d.uri = c, client.NewBackend(c), u
				d.gen++
				d.log.Info("memory lease moved; following it", "lease", d.leaseID, "to", u.Address)
				return d.b, nil
			}
			err = derr
		} else if err == nil {
			err = fmt.Errorf("lease %s: the control plane still has the same URI", d.leaseID)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("lease %s: following the moved lease: %w", d.leaseID, err)
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// resolve is the lease's URI now, from src.
func (d *memDevice) resolve(ctx context.Context) (protocol.URI, error) {
	l, err := d.src.Lease(ctx, d.leaseID)
	if err != nil {
		return protocol.URI{}, err
	}
	us, err := MemoryURIs(l)
	if err != nil {
		return protocol.URI{}, err
	}
	return us[0], nil
}

func (d *memDevice) Size() int64 {
	b, _ := d.cur()
	return b.Size()
}

func (d *memDevice) ReadAt(p []byte, off int64) (n int, err error) {
	err = d.call(func(b *client.Backend) error {
		n, err = b.ReadAt(p, off)
		return err
	})
	return n, err
}

func (d *memDevice) WriteAt(p []byte, off int64) (n int, err error) {
	err = d.call(func(b *client.Backend) error {
		n, err = b.WriteAt(p, off)
		return err
	})
	return n, err
}

func (d *memDevice) Flush() error {
	return d.call(func(b *client.Backend) error { return b.Flush() })
}

func (d *memDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return d.c.Close()
}

// MultiConnSafe: the donor's memory is as durable as it gets.
func (d *memDevice) MultiConnSafe() bool { return true }
