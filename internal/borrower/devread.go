package borrower

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
)

// BlockRange returns where bytes [off, off+n) of active block lease l are,
// for an accelerator slot to read or write them directly (accel.Conn's
// Load, Store and RunBlockTask): the lease's part URIs in layout order and
// its stripe unit. The range must lie inside the lease. The result carries
// the lease's credentials: hand it to the slot of an accelerator lease of
// your own for one request, and never log it (it logs redacted).
func BlockRange(l api.Lease, off, n int64) (accel.BlockRange, error) {
	uris, err := BlockURIs(l)
	if err != nil {
		return accel.BlockRange{}, err
	}
	if off < 0 || n < 0 || off > l.Size || n > l.Size-off {
		return accel.BlockRange{}, fmt.Errorf("range [%d, +%d) is outside lease %s (%d bytes)", off, n, l.ID, l.Size)
	}
	r := accel.BlockRange{Parts: uris, Offset: uint64(off)}
	if len(uris) > 1 {
		su := l.StripeUnit
		if su == 0 {
			su = stripe.DefaultStripeUnit
		}
		// The slot stripes the parts with this unit: one Attach would
		// refuse (stripe.New) must not reach it truncated to 32 bits.
		if su < stripe.MinStripeUnit || su > stripe.MaxStripeUnit || su&(su-1) != 0 {
			return accel.BlockRange{}, fmt.Errorf("lease %s: stripe unit %d is not a power of two in [%d, %d]",
				l.ID, su, stripe.MinStripeUnit, stripe.MaxStripeUnit)
		}
		r.StripeUnit = uint32(su)
	}
	return r, nil
}

// DefaultRelayChunk is how much RelayLoad and RelayStore move per request.
const DefaultRelayChunk = 4 << 20

// relayDepth is how many chunks RelayLoad and RelayStore have in flight.
const relayDepth = 4

// RelayLoad is the path bytes take when the borrower feeds an accelerator
// itself: it reads n bytes of block range r here, from the block lenders,
// and writes them into the slot's memory at addr. Chunks of chunk bytes
// (0: DefaultRelayChunk) are relayed relayDepth at a time, so reading one
// overlaps writing another; a chunk of at least n reads everything before
// writing anything (store and forward). tlsCfg is the client
// configuration for parts whose URI asks for TLS (as AttachConfig.TLS).
func RelayLoad(ctx context.Context, c *accel.Conn, addr uint64, n uint32, r accel.BlockRange, chunk int, tlsCfg *tls.Config) error {
	return relay(ctx, c, n, r, chunk, false, tlsCfg, func(vol *stripe.Volume, off uint64, buf []byte) error {
		if k, err := vol.ReadAt(buf, int64(r.Offset+off)); err != nil || k != len(buf) {
			return fmt.Errorf("read the block lease at %d: %d of %d bytes: %w", r.Offset+off, k, len(buf), err)
		}
		return c.WriteMem(ctx, addr+off, buf)
	})
}

// RelayStore is RelayLoad's other direction: it reads n bytes of the
// slot's memory at addr and writes them to block range r from here, then
// flushes the range's parts.
func RelayStore(ctx context.Context, c *accel.Conn, addr uint64, n uint32, r accel.BlockRange, chunk int, tlsCfg *tls.Config) error {
	return relay(ctx, c, n, r, chunk, true, tlsCfg, func(vol *stripe.Volume, off uint64, buf []byte) error {
		b, err := c.ReadMem(ctx, addr+off, uint32(len(buf)))
		if err != nil {
			return err
		}
		if _, err := vol.WriteAt(b, int64(r.Offset+off)); err != nil {
			return fmt.Errorf("write the block lease at %d: %w", r.Offset+off, err)
		}
		return nil
	})
}

// relay runs move over the chunks of [0, n), relayDepth at a time, then
// flushes the volume if asked.
func relay(ctx context.Context, c *accel.Conn, n uint32, r accel.BlockRange, chunk int, flush bool, tlsCfg *tls.Config,
	move func(vol *stripe.Volume, off uint64, buf []byte) error) error {
	if chunk <= 0 {
		chunk = DefaultRelayChunk
	}
	// A chunk travels in one frame: keep it under the slot's limit.
	if mp := c.Info().MaxPayload; mp > 4096 && uint64(chunk) > uint64(mp)-4096 {
		chunk = int(mp - 4096)
	}
	vol, err := stripe.Open(ctx, stripe.OpenConfig{URIs: r.Parts, StripeUnit: int64(r.StripeUnit), TLS: tlsCfg})
	if err != nil {
		return err
	}
	defer vol.Close()
	stop := context.AfterFunc(ctx, func() { _ = vol.Close() })
	defer stop()
	if size := uint64(vol.Size()); r.Offset > size || uint64(n) > size-r.Offset {
		return fmt.Errorf("range [%d, +%d) outside the block lease's %d-byte volume", r.Offset, n, size)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, relayDepth)
	)
	failed := func() bool { mu.Lock(); defer mu.Unlock(); return first != nil }
	for off := uint64(0); off < uint64(n) && !failed(); off += uint64(chunk) {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := move(vol, off, make([]byte, min(uint64(chunk), uint64(n)-off))); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first == nil && flush {
		first = vol.Flush()
	}
	if first != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}
