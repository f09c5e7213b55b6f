package characterize

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
)

// Device is what Measure exercises. An nbd.Client satisfies it.
type Device interface {
	io.ReaderAt
	io.WriterAt
	Size() int64
	Flush() error
}

// ErrTooSmall is returned when the device cannot hold the requested streams.
var ErrTooSmall = errors.New("characterize: device too small for the requested streams")

// ErrOptions is returned for options beyond what a measurement may ask.
var ErrOptions = errors.New("characterize: bad options")

// Bounds of a measurement's options: every stream holds a request's
// buffer (MaxBuffered in all, e.g. 1,024 streams of 1 MiB), and the
// latency probe keeps every sample.
const (
	MaxStreams    = 1024
	MaxBuffered   = 1 << 30
	MaxLatencyOps = 1_000_000
)

// Options controls a measurement. Zero values take the defaults.
type Options struct {
	MaxStreams   int              // concurrent streams to try, 1..MaxStreams (default 8)
	BytesPerStep int64            // bytes moved by all streams together per step (default 256 MiB)
	RequestSize  int              // sequential request size (default 1 MiB)
	LatencyOps   int              // 4 KiB random reads for the latency figure (default 2000)
	Now          func() time.Time // clock for timing (default time.Now)
	Model        string
	// Progress, when set, is called after each step.
	Progress func(op string, streams int, bps float64)
}

func (o *Options) defaults() {
	if o.MaxStreams <= 0 {
		o.MaxStreams = 8
	}
	if o.BytesPerStep <= 0 {
		o.BytesPerStep = 256 << 20
	}
	if o.RequestSize <= 0 {
		o.RequestSize = 1 << 20
	}
	if o.LatencyOps <= 0 {
		o.LatencyOps = 2000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Measure runs the sequential write and read sweeps and the latency probe.
// It overwrites the device's contents.
func Measure(ctx context.Context, dev Device, o Options) (api.Profile, error) {
	o.defaults()
	switch {
	case o.MaxStreams > MaxStreams:
		return api.Profile{}, fmt.Errorf("%w: %d streams (at most %d)", ErrOptions, o.MaxStreams, MaxStreams)
	case int64(o.MaxStreams)*int64(o.RequestSize) > MaxBuffered:
		return api.Profile{}, fmt.Errorf("%w: %d streams of %d-byte requests hold more than %d MiB of buffers", ErrOptions, o.MaxStreams, o.RequestSize, MaxBuffered>>20)
	case o.LatencyOps > MaxLatencyOps:
		return api.Profile{}, fmt.Errorf("%w: %d latency reads (at most %d)", ErrOptions, o.LatencyOps, MaxLatencyOps)
	}
	size := dev.Size()
	p := api.Profile{ID: o.Model, Model: o.Model, State: "measured", Source: "measured"}
	for n := 1; n <= o.MaxStreams; n++ {
		region := size / int64(n)
		region -= region % int64(o.RequestSize)
		per := o.BytesPerStep / int64(n)
		per -= per % int64(o.RequestSize)
		if per > region {
			per = region
		}
		if per < int64(o.RequestSize) {
			return p, fmt.Errorf("%w: %d bytes for %d streams of %d-byte requests", ErrTooSmall, size, n, o.RequestSize)
		}
		w, err := sweep(ctx, dev, n, region, per, o, true)
		if err != nil {
			return p, fmt.Errorf("characterize: %d writers: %w", n, err)
		}
		p.WriteBps = append(p.WriteBps, w)
		if o.Progress != nil {
			o.Progress("write", n, w)
		}
		r, err := sweep(ctx, dev, n, region, per, o, false)
		if err != nil {
			return p, fmt.Errorf("characterize: %d readers: %w", n, err)
		}
		p.ReadBps = append(p.ReadBps, r)
		if o.Progress != nil {
			o.Progress("read", n, r)
		}
	}
	lat, err := latency4K(ctx, dev, o)
	if err != nil {
		return p, err
	}
	p.Latency4KUs = lat
	p.MeasuredAt = o.Now().UTC()
	return p, nil
}

// sweep runs n streams, stream i moving per bytes sequentially from
// offset i*region, and returns the delivered aggregate bytes/s (writes
// include the final flush).
func sweep(ctx context.Context, dev Device, n int, region, per int64, o Options, write bool) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := o.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(base int64) {
			defer wg.Done()
			buf := make([]byte, o.RequestSize)
			for j := range buf {
				buf[j] = byte(j*7 + int(base>>20))
			}
			for off := int64(0); off < per; off += int64(len(buf)) {
				if ctx.Err() != nil {
					errs <- ctx.Err()
					return
				}
				var err error
				if write {
					_, err = dev.WriteAt(buf, base+off)
				} else {
					_, err = dev.ReadAt(buf, base+off)
				}
				if err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}(int64(i) * region)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	if write {
		if err := dev.Flush(); err != nil {
			return 0, err
		}
	}
	el := o.Now().Sub(start).Seconds()
	if el <= 0 {
		el = 1e-9
	}
	return float64(per*int64(n)) / el, nil
}

// latency4K returns the median latency of 4 KiB random reads in µs.
func latency4K(ctx context.Context, dev Device, o Options) (float64, error) {
	blocks := dev.Size() / 4096
	if blocks == 0 {
		return 0, ErrTooSmall
	}
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 4096)
	lats := make([]float64, 0, o.LatencyOps)
	for i := 0; i < o.LatencyOps; i++ {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		off := r.Int64N(blocks) * 4096
		t0 := o.Now()
		if _, err := dev.ReadAt(buf, off); err != nil {
			return 0, fmt.Errorf("characterize: 4k read: %w", err)
		}
		lats = append(lats, float64(o.Now().Sub(t0).Nanoseconds())/1e3)
	}
	sort.Float64s(lats)
	return lats[len(lats)/2], nil
}
