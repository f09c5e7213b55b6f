package stripe

import (
	"errors"
	"sync/atomic"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// asyncReader is implemented by devices that can send a read and hear its
// outcome later (nbdPart, a Pool of them), as asyncWriter for writes:
// startRead sends a read into b (which must stay untouched until done) and
// calls done exactly once with what ReadAt would have returned as error —
// possibly before it returns, possibly from another goroutine. done must
// not block.
type asyncReader interface {
	startRead(b []byte, off int64, done func(error))
}

// startRead implements asyncReader: b is read on the current connection and
// done gets what ReadAt would have returned. A read that fails, or cannot
// be sent (a connection already broken, a read larger than the lender
// takes), is finished on a goroutine of its own, never on the caller's (the
// local export's reader, which would stop reading for every part while one
// redials) nor on the one that read its reply: a broken connection is
// redialled and the read retried once there.
func (p *nbdPart) startRead(b []byte, off int64, done func(error)) {
	c := p.cur.Load()
	err := c.StartRead(b, off, func(err error) {
		if err == nil {
			done(nil)
			return
		}
		go func() { done(p.finish(false, c, err, readInto(b, off))) }()
	})
	if err != nil {
		go func() {
			if errors.Is(err, nbd.ErrTooLarge) {
				err = readInto(b, off)(c)
			}
			done(p.finish(false, c, err, readInto(b, off)))
		}()
	}
}

// readInto is a synchronous read of b at off on a connection (the retry of
// a failed started read).
func readInto(b []byte, off int64) func(*nbd.Client) error {
	return func(c *nbd.Client) error {
		_, err := c.ReadAt(b, off)
		return err
	}
}

// startRead implements asyncReader on the least busy connection.
func (p *Pool) startRead(b []byte, off int64, done func(error)) {
	i := p.pickIndex()
	p.conns[i].(asyncReader).startRead(b, off, func(err error) {
		p.inflight[i].Add(-1)
		done(err)
	})
}

// canStartRead reports whether d can start reads (a Pool only if every
// connection can).
func canStartRead(d Device) bool {
	switch d := d.(type) {
	case *Pool:
		for _, c := range d.conns {
			if !canStartRead(c) {
				return false
			}
		}
		return true
	case asyncReader:
		return true
	}
	return false
}

// startRead starts a read of p at off on the parts it spans, when each is
// live, can start reads and bounds its requests itself; done then gets what
// ReadAt would have returned as error (the first sub-read's failure), once
// every sub-read has answered. false means nothing was started (ReadAt
// serves it).
func (v *Volume) startRead(p []byte, off int64, done func(error)) bool {
	n := int64(len(p))
	if off < 0 || n == 0 || off+n > v.size {
		return false
	}
	if c, ok := v.single(off, n); ok {
		// Most small reads: no sub-request list or join.
		if !v.canStart(c.dev) {
			return false
		}
		v.parts[c.dev].dev.(asyncReader).startRead(p, c.devOff, func(err error) { done(v.outcome(c.dev, err)) })
		return true
	}
	cs := v.split(off, n)
	for _, c := range cs {
		if !v.canStart(c.dev) {
			return false
		}
	}
	piece := join(len(cs), done)
	for _, c := range cs {
		v.parts[c.dev].dev.(asyncReader).startRead(p[c.volOff-off:c.volOff-off+c.len], c.devOff, func(err error) {
			piece(v.outcome(c.dev, err))
		})
	}
	return true
}

// join returns what each of n pieces calls once with its outcome: the last
// call calls done once, with the first failure (nil if none).
func join(n int, done func(error)) func(error) {
	var (
		left  atomic.Int32
		first atomic.Pointer[error]
	)
	left.Store(int32(n))
	return func(err error) {
		if err != nil {
			first.CompareAndSwap(nil, &err)
		}
		if left.Add(-1) == 0 {
			if e := first.Load(); e != nil {
				done(*e)
			} else {
				done(nil)
			}
		}
	}
}

// canStart reports whether a read can be started on part i now.
func (v *Volume) canStart(i int) bool {
	m := v.parts[i]
	return m.selfTimed && m.startsReads && v.live(i) == nil
}
