package client

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// Backend serves a memory lease as a block device: it satisfies the NBD
// server's Backend interface (io.ReaderAt, io.WriterAt, Size, Flush), so a
// lease can be exported over NBD and used as swap or scratch space by any
// NBD client (Venice's remote memory as swap). Requests take the adaptive
// channel: the NBD server's concurrent requests are pipelined on the queue
// pair and large ones use the bulk streams.
//
// The zero Backend is not usable; build one with NewBackend. It is safe for
// concurrent use.
type Backend struct {
	c       *Client
	timeout time.Duration
}

// NewBackend adapts c.
func NewBackend(c *Client) *Backend { return &Backend{c: c, timeout: c.opts.Timeout} }

// Size is the region size (a multiple of the page size, so of 512).
func (b *Backend) Size() int64 { return b.c.Size() }

func (b *Backend) clip(n int, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: negative offset", protocol.ErrOutOfRange)
	}
	if off >= b.c.size {
		if n == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	return int(min(int64(n), b.c.size-off)), nil
}

// ReadAt reads from the region; a read past the end is short with io.EOF.
func (b *Backend) ReadAt(p []byte, off int64) (int, error) {
	n, err := b.clip(len(p), off)
	if err != nil || n == 0 {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	if err := b.c.Read(ctx, ChannelAdaptive, p[:n], off); err != nil {
		return 0, err
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes to the region; writes past the end fail.
func (b *Backend) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off > b.c.size-int64(len(p)) {
		return 0, fmt.Errorf("%w: write [%d,+%d)", protocol.ErrOutOfRange, off, len(p))
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	if err := b.c.Write(ctx, ChannelAdaptive, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush returns nil: an acknowledged write is already in the donor's memory
// (there is no volatile cache between), which is all a memory lease offers.
func (b *Backend) Flush() error { return b.c.err() }

// MultiConnSafe reports that every NBD connection sees the same memory, so
// NBD_FLAG_CAN_MULTI_CONN may be advertised.
func (b *Backend) MultiConnSafe() bool { return true }
