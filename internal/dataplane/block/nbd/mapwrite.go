package nbd

import (
	"context"
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
// short leaves part of it written, as an unacknowledged write may.
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
	defer mt.unmapRange()
	if err := c.readPayloadMapped(p, tls); err != nil {
		return true, err
	}
	mappedWrites.Add(1)
	if tls {
		tlsMappedWrites.Add(1)
	}
	c.encodeOK(o)
	return true, nil
}

// readPayloadMapped is readPayload (or, on a plain socket, readPayloadRaw)
// into mapped memory: a fault (the file truncated under the mapping) ends
// the connection instead of the process.
func (c *conn) readPayloadMapped(p []byte, tls bool) (err error) {
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
			err = fmt.Errorf("nbd: write into the file's mapping: %w", re)
		}
	}()
	if tls {
		return c.readPayload(p)
	}
	return c.readPayloadRaw(p)
}

// readPayloadRaw fills p from the plain socket: the bytes already in the
// read buffer, then straight from the socket with read(2), waking once per
// maxRcvLowat bytes of a payload that trickles in, as a spliced payload
// does. read(2) into a range the file no longer backs fails (EFAULT)
// rather than faulting.
func (c *conn) readPayloadRaw(p []byte) error {
	n := 0
	if b := c.r.Buffered(); b > 0 {
		n, _ = c.r.Read(p[:min(len(p), b)])
		c.recv.Add(int64(n))
	}
	var lw lowat
	defer lw.reset(c)
	for n < len(p) {
		var (
			m    int
			rerr error
		)
		err := c.rawc.Read(func(fd uintptr) bool {
			for {
				m, rerr = unix.Read(int(fd), p[n:])
				if rerr == unix.EINTR {
					continue
				}
				if rerr == unix.EAGAIN {
					lw.await(c, fd, len(p)-n)
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
		n += m
		c.recv.Add(int64(m))
		lw.owed(c, len(p)-n)
	}
	return nil
}
