package nbd

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/tlspsk"
	"github.com/rialto-project/rialto/internal/pki"
)

// ErrTLSRequired is returned by Dial when the server requires TLS
// (NBD_REP_ERR_TLS_REQD) and the client was not given a TLS configuration.
var ErrTLSRequired = errors.New("nbd: the server requires TLS (use an nbds:// URI or WithTLS)")

// errTLSPlaintextExportName ends a handshake in which a client asked for an
// export with NBD_OPT_EXPORT_NAME before TLS on a server that requires it;
// that option has no error reply, so the server can only hang up.
var errTLSPlaintextExportName = errors.New("nbd: NBD_OPT_EXPORT_NAME before STARTTLS on a server that requires TLS")

// tlsRecord is the largest TLS record payload; crypto/tls sends one record
// per system call.
const tlsRecord = 16 << 10

// tlsConn is an NBD connection upgraded with NBD_OPT_STARTTLS. Its Close
// closes the socket at once (crypto/tls would first try to send
// close_notify, which waits for a peer that no longer reads); closeNotify
// ends the session in order. Writes must be serialised by the caller, as
// they are by the server's and the client's write locks.
type tlsConn struct {
	*tls.Conn
	raw  net.Conn
	wbuf []byte
	// drain makes closeNotify read the peer's stream to its end before
	// it closes the socket (endSession): set on the server's
	// connections.
	drain bool
}

func newTLSConn(tc *tls.Conn, raw net.Conn) *tlsConn { return &tlsConn{Conn: tc, raw: raw} }

func (t *tlsConn) Close() error { return t.raw.Close() }

// closeNotify sends close_notify (waiting at most d for the peer to take
// it) and closes the socket.
func (t *tlsConn) closeNotify(d time.Duration) { endSession(t.raw, t.Conn, d, t.drain) }

// endSession sends close_notify with session's CloseWrite, waiting at most
// d for the peer to take it, and closes the socket raw. With drain it
// first reads and drops what the peer still sends, up to the end of its
// stream (until d at most): closing a socket with bytes unread resets the
// connection, which drops what the socket still holds to send. A client
// that sends NBD_CMD_DISC with requests outstanding follows it with its
// close_notify (libnbd does) and reads the replies it is owed; a server
// that stopped reading at the disconnect would reset them away. A raw
// socket has no deadlines: a timer shuts it down instead, which ends the
// waits.
func endSession(raw net.Conn, session interface{ CloseWrite() error }, d time.Duration, drain bool) {
	deadline := time.Now().Add(d)
	if err := raw.SetWriteDeadline(deadline); err != nil {
		tm := time.AfterFunc(d, func() { raw.Close() })
		defer tm.Stop()
	} else if drain {
		raw.SetReadDeadline(deadline)
	}
	session.CloseWrite()
	if drain {
		io.Copy(io.Discard, raw)
	}
	raw.Close()
}

// pskConn is an NBD connection upgraded with NBD_OPT_STARTTLS to TLS with
// a pre-shared key. Like tlsConn, its Close closes the socket at once and
// closeNotify ends the session in order.
type pskConn struct {
	*tlspsk.Conn
	raw   net.Conn
	drain bool // as tlsConn's
}

func (p *pskConn) Close() error { return p.raw.Close() }

func (p *pskConn) closeNotify(d time.Duration) { endSession(p.raw, p.Conn, d, p.drain) }

// readerConn is a connection whose reads go through r: the server hands
// crypto/tls the socket's fastReader this way, so that TLS connections wait
// for requests as plaintext ones do. After the handshake the server points
// Conn at the raw socket (rawsock.go), before the transmission phase's
// goroutines start.
//
// While gathering (writeBuffers over TLS sets it), writes are kept and
// leave together at flush, in one system call per gatherMax bytes rather
// than one per TLS record: crypto/tls writes each record on its own, and a
// group of 16 4 KiB read replies makes five records. Only the goroutine
// holding the connection's write lock gathers and flushes; gmu orders its
// records with any crypto/tls writes on its own (a key update's reply,
// from the reading goroutine).
type readerConn struct {
	net.Conn
	r io.Reader

	gmu       sync.Mutex
	gathering bool
	pend      []byte
}

// gatherMax is how many bytes of records gathering holds before it writes
// them.
const gatherMax = 64 << 10

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *readerConn) Write(p []byte) (int, error) {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if !c.gathering || (len(c.pend) == 0 && len(p) >= gatherMax) {
		return c.Conn.Write(p)
	}
	c.pend = append(c.pend, p...)
	if len(c.pend) >= gatherMax {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (c *readerConn) gather() {
	c.gmu.Lock()
	c.gathering = true
	c.gmu.Unlock()
}

// flush writes the records gathered and ends gathering.
func (c *readerConn) flush() error {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	c.gathering = false
	return c.flushLocked()
}

func (c *readerConn) flushLocked() error {
	if len(c.pend) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.pend)
	c.pend = c.pend[:0]
	return err
}

// tlsRecordHeader is a TLS record's header: type, version, u16 length.
const tlsRecordHeader = 5

// recordReader hands crypto/tls the socket's bytes one TLS record at a
// time, so that the server knows whether a whole record (normally the next
// request) is already here: crypto/tls reads ahead into a buffer of its own
// and has no way to ask. It reads as much as the socket has in one system
// call into its own buffer, as crypto/tls would, and passes the rest of a
// record straight into crypto/tls's buffer when it holds nothing (large
// writes' payloads are not copied twice).
//
// Before it goes to the socket it calls wait, if set: the connection's
// reader sends the replies it holds there, so that a record that turns out
// not to be a request (a key update, an empty record) cannot leave it
// waiting for a client that waits for those replies. Only the goroutine
// reading the TLS session uses it.
type recordReader struct {
	src      io.Reader
	buf      []byte
	off, end int  // buf[off:end] read, not yet handed out
	left     int  // bytes of the current record still to hand out
	full     bool // the last read filled buf: the socket may have more
	wait     func() error
	got      *atomic.Int64 // counts the bytes read from src, if set (conn.recv)
}

// recordBufMin and recordBufMax bound the record reader's buffer: it
// starts small and grows when a read fills it (the client streams large
// writes faster than the server takes them), so that one system call
// takes up to recordBufMax bytes of records.
const (
	recordBufMin = 64 << 10
	recordBufMax = 256 << 10
)

func newRecordReader(src io.Reader) *recordReader {
	return &recordReader{src: src, buf: make([]byte, recordBufMin)}
}

func (r *recordReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.left == 0 {
		if err := r.fill(tlsRecordHeader); err != nil {
			return 0, err
		}
		r.left = tlsRecordHeader + int(binary.BigEndian.Uint16(r.buf[r.off+3:]))
	}
	want := min(len(p), r.left)
	if r.end > r.off {
		n := copy(p[:want], r.buf[r.off:r.end])
		r.off += n
		r.left -= n
		return n, nil
	}
	if err := r.waiting(); err != nil {
		return 0, err
	}
	n, err := r.src.Read(p[:want])
	r.count(n)
	r.left -= n
	return n, err
}

func (r *recordReader) count(n int) {
	if r.got != nil && n > 0 {
		r.got.Add(int64(n))
	}
}

func (r *recordReader) waiting() error {
	if r.wait == nil {
		return nil
	}
	return r.wait()
}

// fill reads until at least k (at most tlsRecordHeader) bytes are
// buffered.
func (r *recordReader) fill(k int) error {
	for r.end-r.off < k {
		if r.off == r.end {
			r.off, r.end = 0, 0
			if r.full && len(r.buf) < recordBufMax {
				r.buf = make([]byte, min(2*len(r.buf), recordBufMax))
			}
		} else if len(r.buf)-r.end < k {
			r.end = copy(r.buf, r.buf[r.off:r.end])
			r.off = 0
		}
		if err := r.waiting(); err != nil {
			return err
		}
		n, err := r.src.Read(r.buf[r.end:])
		r.count(n)
		r.end += n
		r.full = r.end == len(r.buf)
		if err != nil {
			if r.end-r.off >= k {
				return nil // the error comes again on the next read
			}
			if errors.Is(err, io.EOF) && r.end > r.off {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// recordBuffered reports whether a whole record is here, beyond what
// crypto/tls has taken: the next read of the session needs no wait.
func (r *recordReader) recordBuffered() bool {
	have := r.end - r.off
	if r.left > 0 {
		return have >= r.left
	}
	return have >= tlsRecordHeader && have >= tlsRecordHeader+int(binary.BigEndian.Uint16(r.buf[r.off+3:]))
}

// readPayload reads a write request's payload into p. Over TLS it takes
// what the reader's buffer holds, then reads straight from crypto/tls: a
// bufio.Reader reads a short tail (under its size) through its buffer,
// one more copy of up to 48 KiB of every 256 KiB payload.
func (c *conn) readPayload(p []byte) error {
	if c.sess == nil || c.sess.tls == nil {
		_, err := io.ReadFull(c.r, p)
		return err
	}
	n := 0
	return c.readPayloadTLS(p, &n)
}

// writeBuffers writes v to w, consuming it: with one writev on a plain
// socket, and on a TLS connection in as few records (and so system calls)
// as the bytes allow: crypto/tls makes at least one record per Write, so
// writing a reply header and its payload separately would cost two records
// and two system calls where one does.
func writeBuffers(w net.Conn, v *net.Buffers) (int64, error) {
	if rs, ok := w.(*rawSock); ok {
		return rs.writev(v)
	}
	if p, ok := w.(*pskConn); ok {
		// tlspsk packs the buffers into as few records and writes as
		// they allow.
		n, err := p.WriteBuffers(*v)
		*v = (*v)[len(*v):]
		return n, err
	}
	t, ok := w.(*tlsConn)
	if !ok {
		return v.WriteTo(w)
	}
	if rc, ok := t.Conn.NetConn().(*readerConn); ok {
		rc.gather()
		n, err := t.writeRecords(v)
		if ferr := rc.flush(); err == nil && ferr != nil {
			err = ferr
		}
		return n, err
	}
	return t.writeRecords(v)
}

// writeRecords writes v to t in as few records as the bytes allow.
func (t *tlsConn) writeRecords(v *net.Buffers) (int64, error) {
	var total int64
	buf := t.wbuf[:0]
	if cap(buf) < tlsRecord {
		buf = make([]byte, 0, tlsRecord)
	}
	defer func() { t.wbuf = buf[:0] }()
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		n, err := t.Conn.Write(buf)
		total += int64(n)
		buf = buf[:0]
		return err
	}
	for _, b := range *v {
		for len(b) > 0 {
			if len(buf) == 0 && len(b) >= tlsRecord {
				// Whole records straight from b, without copying.
				k := len(b) - len(b)%tlsRecord
				n, err := t.Conn.Write(b[:k])
				total += int64(n)
				if err != nil {
					return total, err
				}
				b = b[k:]
				continue
			}
			k := min(len(b), tlsRecord-len(buf))
			buf = append(buf, b[:k]...)
			b = b[k:]
			if len(buf) == tlsRecord {
				if err := flush(); err != nil {
					return total, err
				}
			}
		}
	}
	*v = (*v)[len(*v):]
	return total, flush()
}

// LoadTLSDir builds a client TLS configuration from a directory in the
// layout libnbd's tls-certificates=DIR and qemu's tls-creds-x509 use:
// ca-cert.pem (required: the CAs the server's certificate must chain to),
// ca-crl.pem (optional: server certificates it revokes are refused, as
// libnbd and qemu refuse them; it is read again when it changes) and,
// optionally, client-cert.pem with client-key.pem (a client certificate,
// for servers that ask for one).
func LoadTLSDir(dir string) (*tls.Config, error) {
	ca, err := os.ReadFile(filepath.Join(dir, "ca-cert.pem"))
	if err != nil {
		return nil, fmt.Errorf("nbd: TLS certificates: %w", err)
	}
	roots, err := pki.ParseCerts(ca)
	if err != nil {
		return nil, fmt.Errorf("nbd: TLS certificates: %s: %w", filepath.Join(dir, "ca-cert.pem"), err)
	}
	pool := x509.NewCertPool()
	for _, c := range roots {
		pool.AddCert(c)
	}
	crl := pki.NewCRL(roots)
	if err := crl.Watch(filepath.Join(dir, pki.CRLFile)); err != nil {
		return nil, fmt.Errorf("nbd: TLS certificates: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, VerifyConnection: crl.VerifyPeer}
	certFile, keyFile := filepath.Join(dir, "client-cert.pem"), filepath.Join(dir, "client-key.pem")
	_, cerr := os.Stat(certFile)
	_, kerr := os.Stat(keyFile)
	switch {
	case cerr == nil && kerr == nil:
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("nbd: TLS certificates: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case errors.Is(cerr, fs.ErrNotExist) && errors.Is(kerr, fs.ErrNotExist):
	default:
		return nil, fmt.Errorf("nbd: TLS certificates: %s needs both client-cert.pem and client-key.pem, or neither", dir)
	}
	return cfg, nil
}
