package borrower

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
)

// ErrVerify reports that data read back differs from what was written.
// (Its text names the memory data plane, as `rialto memtest` always showed
// it.)
var ErrVerify = errors.New("memory: verification failed")

// MemtestStep is the outcome of one step of Memtest.
type MemtestStep struct {
	Name     string
	Bytes    int64
	Duration time.Duration
	Skipped  string // why the step did not run, if it did not
	Err      error
}

// pattern fills p with bytes derived from its region offset and a seed, so
// any misplaced or stale byte is detected.
func pattern(p []byte, off int64, seed uint64) {
	var w [8]byte
	for i := 0; i < len(p); {
		a := uint64(off+int64(i)) &^ 7
		binary.LittleEndian.PutUint64(w[:], a*0x9E3779B97F4A7C15^seed)
		s := int(uint64(off+int64(i)) - a)
		i += copy(p[i:], w[s:])
	}
}

// MemorySession is a session with a memory lease's region that Memtest
// runs on: a *client.Client, or a *client.Following (FollowMemory), which
// follows the region when the lease moves.
type MemorySession interface {
	mapping.Session
	Read(ctx context.Context, ch client.Channel, p []byte, off int64) error
	Write(ctx context.Context, ch client.Channel, p []byte, off int64) error
}

// Memtest runs a verification pattern over every channel and the mapping,
// within the first span bytes of the region (0: all of it): random small
// writes on the synchronous channel read back on the queue pair, a full
// write on the bulk channel read back on the synchronous one, pipelined
// writes on the queue pair read back on the bulk channel, adaptive writes of
// mixed sizes, and writes through the transparent mapping (cache 10%)
// flushed and read back on the bulk channel. It is what `rialto memtest`
// runs on each part of a lease (MemtestLease). It overwrites the span. A
// mapping step where userfaultfd is refused is skipped, not failed.
func Memtest(ctx context.Context, c MemorySession, span int64) ([]MemtestStep, error) {
	if span <= 0 || span > c.Size() {
		span = c.Size()
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var steps []MemtestStep
	step := func(name string, f func() (int64, error)) {
		t0 := time.Now()
		n, err := f()
		st := MemtestStep{Name: name, Bytes: n, Duration: time.Since(t0), Err: err}
		if errors.Is(err, mapping.ErrUffdUnavailable) {
			st.Skipped, st.Err = err.Error(), nil
		}
		steps = append(steps, st)
	}
	small := func(wch, rch client.Channel, count int, sizes []int) (int64, error) {
		seed := rng.Uint64()
		var total int64
		for range count {
			n := int(min(int64(sizes[rng.IntN(len(sizes))]), span))
			off := rng.Int64N(span - int64(n) + 1)
			p := make([]byte, n)
			pattern(p, off, seed)
			if err := c.Write(ctx, wch, p, off); err != nil {
				return total, err
			}
			got := make([]byte, n)
			if err := c.Read(ctx, rch, got, off); err != nil {
				return total, err
			}
			if !bytes.Equal(got, p) {
				return total, fmt.Errorf("%w: %d bytes at %d (%v write, %v read)", ErrVerify, n, off, wch, rch)
			}
			total += int64(n)
		}
		return total, nil
	}
	whole := func(wch, rch client.Channel) (int64, error) {
		seed := rng.Uint64()
		p := make([]byte, span)
		pattern(p, 0, seed)
		if err := c.Write(ctx, wch, p, 0); err != nil {
			return 0, err
		}
		got := make([]byte, span)
		if err := c.Read(ctx, rch, got, 0); err != nil {
			return 0, err
		}
		if i := firstDiff(got, p); i >= 0 {
			return span, fmt.Errorf("%w: first difference at %d (%v write, %v read)", ErrVerify, i, wch, rch)
		}
		return span, nil
	}
	step("sync: random 64 B–4 KiB, read back on queue", func() (int64, error) {
		return small(client.ChannelSync, client.ChannelQueue, 1000, []int{64, 100, 512, 4096})
	})
	step("bulk: whole span, read back on sync", func() (int64, error) { return whole(client.ChannelBulk, client.ChannelSync) })
	step("queue: whole span, read back on bulk", func() (int64, error) { return whole(client.ChannelQueue, client.ChannelBulk) })
	step("adaptive: random 1 B–1 MiB, read back on adaptive", func() (int64, error) {
		return small(client.ChannelAdaptive, client.ChannelAdaptive, 100, []int{1, 64, 4096, 65536, 1 << 20})
	})
	step("mapping: write through the slice (cache 10%), flush, read back on bulk", func() (int64, error) {
		m, err := mapping.Map(ctx, c, mapping.Options{})
		if err != nil {
			return 0, err
		}
		n := min(span, int64(len(m.Bytes())))
		seed := rng.Uint64()
		pattern(m.Bytes()[:n], 0, seed)
		if err := m.Close(); err != nil {
			return 0, err
		}
		want := make([]byte, n)
		pattern(want, 0, seed)
		got := make([]byte, n)
		if err := c.Read(ctx, client.ChannelBulk, got, 0); err != nil {
			return 0, err
		}
		if i := firstDiff(got, want); i >= 0 {
			return n, fmt.Errorf("%w: mapping: first difference at %d", ErrVerify, i)
		}
		return n, nil
	})
	for _, s := range steps {
		if s.Err != nil {
			return steps, fmt.Errorf("memtest %s: %w", s.Name, s.Err)
		}
	}
	return steps, nil
}

func firstDiff(a, b []byte) int {
	for i := 0; i < len(a); i += 4096 {
		j := min(i+4096, len(a))
		if !bytes.Equal(a[i:j], b[i:j]) {
			for k := i; k < j; k++ {
				if a[k] != b[k] {
					return k
				}
			}
		}
	}
	return -1
}

// MemtestPart is the outcome of Memtest on one part of a memory lease.
type MemtestPart struct {
	Part  int
	Steps []MemtestStep
	Err   error // the first failed step's, or Memtest's
}

// MemtestLease runs Memtest over the first span bytes (0: all) of every
// part of memory lease l in turn, each over a session of its own with the
// given request timeout (0: the client's default), which follows the part
// if the lease moves meanwhile, asking src where it is (nil: it does not
// follow). A failed part does not stop the others; its MemtestPart says
// why. A lease whose URIs do not parse, or a donor that refuses the
// session, stops it with an error. tlsCfg is the client configuration for
// parts whose URI asks for TLS (as AttachConfig.TLS).
func MemtestLease(ctx context.Context, src LeaseSource, l api.Lease, span int64, timeout time.Duration, tlsCfg *tls.Config) ([]MemtestPart, error) {
	uris, err := MemoryURIs(l)
	if err != nil {
		return nil, err
	}
	parts := make([]MemtestPart, 0, len(uris))
	for i := range uris {
		c, err := FollowMemory(ctx, src, l, i, client.Options{Timeout: timeout, TLS: tlsCfg}, nil)
		if err != nil {
			return parts, err
		}
		steps, err := Memtest(ctx, c, span)
		c.Close()
		parts = append(parts, MemtestPart{Part: i, Steps: steps, Err: err})
	}
	return parts, nil
}
