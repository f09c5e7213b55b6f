package nbd

import (
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// spliceMin is the smallest write whose payload goes from the socket to the
// file with splice(2) (socket → pipe → file: one copy instead of two).
const spliceMin = 64 << 10

const pipeSize = 1 << 20

// spliceTarget is implemented by backends whose bytes live in a file
// descriptor. spliceDest records the range as written (for extents) and
// returns where it lives, or ok=false when the write must take the buffered
// path (including once the backend is closed). After ok=true the descriptor
// stays open, even across a concurrent Close, until the caller calls
// releaseFD once.
type spliceTarget interface {
	spliceDest(off, n int64) (fd int, foff int64, ok bool)
	releaseFD()
}

// maxRcvLowat bounds the SO_RCVLOWAT a slow payload is awaited with: the
// reader then wakes up once per this many bytes instead of once per TCP
// segment. Over a 200 Mbit/s link each wake-up of Go's netpoller cost the
// lender more CPU than the bytes did (10 s of CPU per GiB written, against
// 1–2 s per GiB read; bench/compose).
const maxRcvLowat = 256 << 10

// setRcvLowat sets the socket's SO_RCVLOWAT (best effort).
func (c *conn) setRcvLowat(n int) {
	c.rawc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
	})
}

// lowat is a TCP socket's SO_RCVLOWAT while the reader takes a payload
// straight from it (spliced, or read into a mapping): raised once the
// payload trickles in, never above what the payload still owes, and set
// back to 1 once it is in. The zero value is the socket's default, 1.
type lowat struct{ n int }

// await is called with the socket's descriptor when it has nothing to
// read and left bytes of the payload are owed.
func (l *lowat) await(c *conn, fd uintptr, left int) {
	if !c.tcp {
		return
	}
	if want := min(left, maxRcvLowat); want != max(l.n, 1) {
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, want)
		l.n = want
	}
}

// owed lowers the mark to the left bytes the payload still owes.
func (l *lowat) owed(c *conn, left int) {
	if l.n > 1 && l.n > left && left > 0 {
		c.setRcvLowat(left)
		l.n = left
	}
}

// reset sets the socket's mark back to 1 if it was raised.
func (l *lowat) reset(c *conn) {
	if l.n > 1 {
		c.setRcvLowat(1)
		l.n = 0
	}
}

func (c *conn) canSplice(r Request) bool {
	return c.sp != nil && c.rawc != nil && c.limit == nil && !c.noSplice && r.Length >= spliceMin
}

func (c *conn) closePipe() {
	if c.pipeR > 0 {
		unix.Close(c.pipeR)
		unix.Close(c.pipeW)
		c.pipeR, c.pipeW = 0, 0
	}
}

// spliceWrite consumes o's payload from the connection and writes it to the
// backend's file. handled=false means nothing was consumed and the caller
// must use the buffered path. A non-nil error means the connection is broken.
// A failure of the file side sets o.errno; the payload is still consumed.
func (c *conn) spliceWrite(o *op) (handled bool, err error) {
	if c.pipeR == 0 {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			c.noSplice = true
			return false, nil
		}
		c.pipeR, c.pipeW = p[0], p[1]
		unix.FcntlInt(uintptr(c.pipeW), unix.F_SETPIPE_SZ, pipeSize)
	}
	off, n := int64(o.req.Offset), int(o.req.Length)
	fd, foff, ok := c.sp.spliceDest(off, int64(n))
	if !ok {
		return false, nil
	}
	defer c.sp.releaseFD()
	var ferr error
	// Bytes of the payload already in the read buffer.
	if k := min(c.r.Buffered(), n); k > 0 {
		b, _ := c.r.Peek(k)
		for done := 0; done < k && ferr == nil; {
			w, err := unix.Pwrite(fd, b[done:], foff+int64(done))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				ferr = err
				break
			}
			done += w
		}
		c.r.Discard(k)
		c.recv.Add(int64(k))
		foff += int64(k)
		n -= k
	}
	var lw lowat
	defer lw.reset(c)
	for n > 0 {
		var (
			m    int
			serr error
		)
		err := c.rawc.Read(func(sfd uintptr) bool {
			for {
				var k int64
				k, serr = unix.Splice(int(sfd), nil, c.pipeW, nil, min(n, pipeSize), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
				m = int(k)
				if serr == unix.EINTR {
					continue
				}
				if serr == unix.EAGAIN {
					// The payload trickles in (a slow link): wake up
					// when much of it is there, not per segment.
					lw.await(c, sfd, n)
				}
				return serr != unix.EAGAIN
			}
		})
		if err != nil {
			return true, err
		}
		if serr != nil {
			if n == int(o.req.Length) && ferr == nil {
				// Splice refused before anything was consumed
				// (e.g. unsupported socket type): fall back.
				c.noSplice = true
				return false, nil
			}
			return true, fmt.Errorf("nbd: splice from socket: %w", serr)
		}
		if m == 0 {
			return true, io.ErrUnexpectedEOF
		}
		c.recv.Add(int64(m))
		n -= m
		lw.owed(c, n)
		for m > 0 {
			if ferr == nil {
				k, err := unix.Splice(c.pipeR, nil, fd, &foff, m, unix.SPLICE_F_MOVE)
				w := int(k)
				if err == unix.EINTR {
					continue
				}
				if err != nil || w == 0 {
					if err == nil {
						err = io.ErrShortWrite
					}
					ferr = err
					continue
				}
				m -= w
				continue
			}
			// The file failed: drain the pipe so the stream stays in sync.
			var scratch [32 << 10]byte
			r, err := unix.Read(c.pipeR, scratch[:min(m, len(scratch))])
			if err == unix.EINTR {
				continue
			}
			if err != nil || r == 0 {
				return true, fmt.Errorf("nbd: drain pipe: %w", err)
			}
			m -= r
		}
	}
	if ferr == nil && o.req.Flags&CmdFlagFUA != 0 {
		ferr = c.be.Flush()
	}
	if ferr != nil {
		o.errno = errnoOf(ferr)
	}
	return true, nil
}
