package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// mappedTarget is implemented by backends that can hand out a writable
// mapping of a range (a FileBackend on tmpfs or ramfs): a write's payload
// is then read (or, over TLS, decrypted) straight into the page cache.
type mappedTarget interface {
	mapWrite(off, n int64) (p []byte, ok bool)
	unmapRange()
}

// mappedWrites counts the writes whose payload went straight from the
// connection into the backend's mapping; tlsMappedWrites those of them
// over TLS.
var mappedWrites, tlsMappedWrites atomic.Int64

// mappedWrite serves o, a write whose payload has not been read yet, by
// reading the payload straight into the backend's mapping: over TLS the
// copy out of crypto/tls's record buffer is then the write, on a plain
// socket read(2)'s copy out of the socket is, with no pooled buffer and no
// pwrite (which copied the payload once more, page by page, under the
// file's lock). On a plain socket this replaces splice(2) for such files:
// moving a 1 MiB payload through a pipe page by page cost the reader more
// than one read into the mapping, and the reader serves every payload of
// its connection (docs/bench/block.md, "Follow-up: 1 MiB sequential writes
// at queue depth 32"). Only under the conditions of the reader's other
// writes (a memory-speed backend, no rate limit, no FUA) and, as spliced
// writes, counted as an untracked write while the export has no move
// state. handled=false leaves o to the ordinary path. Over TLS bytes land
// only after crypto/tls has authenticated their record; a payload cut
// short leaves part of it written, as an unacknowledged write may. Where
// the file stops backing the mapping under the payload (a tmpfs out of
// space, or over its memory cgroup's limit; the file truncated) the rest
// of the payload is written the ordinary way (writeRest), whose error
// answers the write: ENOSPC, as a pwrite or splice of it is answered.
func (c *conn) mappedWrite(ctx context.Context, o *op, live bool) (handled bool, err error) {
	if !live || c.maxGroup <= 1 || c.limit != nil || o.req.Flags&CmdFlagFUA != 0 || ctx.Err() != nil {
		return false, nil
	}
	tls := c.sess != nil && c.sess.tls != nil
	// On a plain socket only payloads splice would take: a smaller one
	// goes on through the read buffer, whose reader polls briefly before
	// it sleeps (a QD1 write's latency).
	if !tls && (c.rawc == nil || (c.sess != nil && c.sess.encrypted()) || o.req.Length < spliceMin) {
		return false, nil
	}
	mt, ok := c.be.(mappedTarget)
	if !ok {
		return false, nil
	}
	if c.e.writes.Begin() != nil {
		return false, nil // the export moves: writes go through its gate
	}
	defer c.e.writes.EndUntracked()
	c.paying.Store(true)
	defer c.paying.Store(false)
	p, ok := mt.mapWrite(int64(o.req.Offset), int64(o.req.Length))
	if !ok {
		return false, nil
	}
	n, err := c.readPayloadMapped(p, tls)
	mt.unmapRange()
	if f := (*mapFault)(nil); errors.As(err, &f) {
		c.s.logger().Debug("nbd: a write's store into the file's mapping failed; the rest of its payload is written with pwrite",
			"export", NameTag(c.e.Name), "offset", o.req.Offset+uint64(n), "err", f)
		return true, c.writeRest(o, n, tls)
	}
	if err != nil {
		return true, err
	}
	mappedWrites.Add(1)
	if tls {
		tlsMappedWrites.Add(1)
	}
	c.encodeOK(o)
	return true, nil
}

// mapFault is a store into the file's mapping that failed: the page is not
// there and cannot be (a tmpfs out of space, the file truncated): a fault
// in Go's copy, EFAULT from read(2).
type mapFault struct{ err error }

func (f *mapFault) Error() string { return "nbd: write into the file's mapping: " + f.err.Error() }
func (f *mapFault) Unwrap() error { return f.err }

// readPayloadMapped is readPayload (or, on a plain socket, readPayloadRaw)
// into mapped memory: n is how much of p was filled from the connection,
// also when a store into p failed (a *mapFault, not a fault of the
// process). The connection's stream is then n bytes into the payload:
// read(2) consumes nothing it could not copy, and a fault in Go's copy out
// of the read buffer or crypto/tls's record leaves what it copied from
// there unconsumed.
func (c *conn) readPayloadMapped(p []byte, tls bool) (n int, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			re, ok := r.(interface {
				runtime.Error
				Addr() uintptr
			})
			if !ok {
				panic(r)
			}
			err = &mapFault{re}
		}
	}()
	if tls {
		err = c.readPayloadTLS(p, &n)
	} else if err = c.readPayloadRaw(p, &n); errors.Is(err, unix.EFAULT) {
		err = &mapFault{err}
	}
	return n, err
}

// restChunk bounds the buffer writeRest reads the rest of a payload into.
const restChunk = 256 << 10

// writeRest finishes o, a mapped write whose store into the mapping failed
// once the first n bytes of its payload had landed: the rest of the
// payload is read through a pooled buffer, a piece at a time, and written
// with the backend's WriteAt (pwrite), whose error answers o. The payload
// is consumed whatever the file does, so that the stream stays in sync; an
// error returned is the connection's.
func (c *conn) writeRest(o *op, n int, tls bool) error {
	rest := int(o.req.Length) - n
	buf := getBuf(min(rest, restChunk))
	defer putBuf(buf)
	off := int64(o.req.Offset) + int64(n)
	var werr error
	for rest > 0 {
		b := (*buf)[:min(rest, len(*buf))]
		var err error
		if tls {
			err = c.readPayload(b)
		} else {
			err = c.readPayloadRaw(b, new(int))
		}
		if err != nil {
			return err
		}
		if werr == nil {
			_, werr = c.be.WriteAt(b, off)
		}
		off += int64(len(b))
		rest -= len(b)
	}
	if werr != nil {
		o.errno = errnoOf(werr)
		c.encodeError(o)
		return nil
	}
	c.encodeOK(o)
	return nil
}

// readPayloadRaw fills p[*done:] from the plain socket, counting in *done
// the bytes of p filled: the bytes already in the read buffer, then
// straight from the socket with read(2), waking once per maxRcvLowat bytes
// of a payload that trickles in, as a spliced payload does. read(2) into a
// range the file no longer backs fails (EFAULT) rather than faulting.
func (c *conn) readPayloadRaw(p []byte, done *int) error {
	if b := c.r.Buffered(); b > 0 && *done < len(p) {
		k, _ := c.r.Read(p[*done:min(len(p), *done+b)])
		*done += k
		c.recv.Add(int64(k))
	}
	var lw lowat
	defer lw.reset(c)
	for *done < len(p) {
		var (
			m    int
			rerr error
		)
		err := c.rawc.Read(func(fd uintptr) bool {
			for {
				m, rerr = unix.Read(int(fd), p[*done:])
				if rerr == unix.EINTR {
					continue
				}
				if rerr == unix.EAGAIN {
					lw.await(c, fd, len(p)-*done)
					return false
				}
				return true
			}
		})
		if err != nil {
			return err
		}
		if rerr != nil {
			return fmt.Errorf("nbd: read write payload: %w", rerr)
		}
		if m == 0 {
			return io.ErrUnexpectedEOF
		}
		*done += m
		c.recv.Add(int64(m))
		lw.owed(c, len(p)-*done)
	}
	return nil
}

// readPayloadTLS fills p[*done:] from the TLS session, counting in *done
// the bytes of p filled: the bytes already in the read buffer, then
// straight from crypto/tls.
func (c *conn) readPayloadTLS(p []byte, done *int) error {
	if b := c.r.Buffered(); b > 0 && *done < len(p) {
		k, _ := c.r.Read(p[*done:min(len(p), *done+b)])
		*done += k
	}
	for *done < len(p) {
		k, err := c.sess.tls.Read(p[*done:])
		*done += k
		if err != nil && *done < len(p) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}
