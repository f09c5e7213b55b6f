package stripe

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Pool spreads one part over several connections to the same export: each
// call goes to the connection with the fewest calls in flight. Flush flushes
// every connection, so a flush on the pool makes every completed write
// durable even if the server does not advertise multi-conn consistency.
// Close closes every connection that is an io.Closer.
type Pool struct {
	conns    []Device
	inflight []atomic.Int64
}

// NewPool returns a pool over conns, which must all reach the same export.
func NewPool(conns ...Device) (*Pool, error) {
	if len(conns) == 0 {
		return nil, fmt.Errorf("%w: empty pool", ErrConfig)
	}
	for i, c := range conns[1:] {
		if c.Size() != conns[0].Size() {
			return nil, fmt.Errorf("%w: pool connection %d has size %d, connection 0 has %d", ErrConfig, i+1, c.Size(), conns[0].Size())
		}
	}
	return &Pool{conns: conns, inflight: make([]atomic.Int64, len(conns))}, nil
}

func (p *Pool) pick() (Device, func()) {
	best := 0
	for i := 1; i < len(p.conns); i++ {
		if p.inflight[i].Load() < p.inflight[best].Load() {
			best = i
		}
	}
	p.inflight[best].Add(1)
	return p.conns[best], func() { p.inflight[best].Add(-1) }
}

// ReadAt reads from the least busy connection.
func (p *Pool) ReadAt(b []byte, off int64) (int, error) {
	c, done := p.pick()
	defer done()
	return c.ReadAt(b, off)
}

// WriteAt writes through the least busy connection.
func (p *Pool) WriteAt(b []byte, off int64) (int, error) {
	c, done := p.pick()
	defer done()
	return c.WriteAt(b, off)
}

// Size is the export size.
func (p *Pool) Size() int64 { return p.conns[0].Size() }

// Flush flushes every connection, in turn.
func (p *Pool) Flush() error {
	var errs []error
	for _, c := range p.conns {
		if err := c.Flush(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Trim discards a range if the connections support it.
func (p *Pool) Trim(off, length int64) error {
	c, done := p.pick()
	defer done()
	t, ok := c.(Trimmer)
	if !ok {
		return ErrUnsupported
	}
	return t.Trim(off, length)
}

// WriteZeroes zeroes a range if the connections support it.
func (p *Pool) WriteZeroes(off, length int64, noHole bool) error {
	c, done := p.pick()
	defer done()
	z, ok := c.(Zeroer)
	if !ok {
		return ErrUnsupported
	}
	return z.WriteZeroes(off, length, noHole)
}

// CanTrim reports whether every connection supports Trim.
func (p *Pool) CanTrim() bool {
	for _, c := range p.conns {
		if !canTrim(c) {
			return false
		}
	}
	return true
}

// CanWriteZeroes reports whether every connection supports WriteZeroes.
func (p *Pool) CanWriteZeroes() bool {
	for _, c := range p.conns {
		if !canZero(c) {
			return false
		}
	}
	return true
}

// Close closes every connection.
func (p *Pool) Close() error {
	var errs []error
	for _, c := range p.conns {
		if cl, ok := c.(interface{ Close() error }); ok {
			if err := cl.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
