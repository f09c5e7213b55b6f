package tlspsk

import (
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Record content types.
const (
	recordChangeCipherSpec = 20
	recordAlert            = 21
	recordHandshake        = 22
	recordApplicationData  = 23
)

const (
	recordHeaderLen = 5
	maxPlaintext    = 1 << 14
	// maxCiphertext bounds a protected record's length (RFC 8446, 5.2).
	maxCiphertext = maxPlaintext + 256
)

// keyUpdateAfter is how many records the server seals under one key
// before it updates it: well within AES-GCM's limit of 2^24.5 full
// records (RFC 8446, 5.5). A variable for tests only.
var keyUpdateAfter uint64 = 1 << 24

// halfConn is one direction's protection.
type halfConn struct {
	s      *suite
	aead   cipher.AEAD
	iv     [12]byte
	seq    uint64
	secret []byte
}

func (h *halfConn) setSecret(s *suite, secret []byte) error {
	a, err := s.aead(expandLabel(secret, "key", nil, s.keyLen))
	if err != nil {
		return err
	}
	h.s, h.aead, h.secret, h.seq = s, a, secret, 0
	copy(h.iv[:], expandLabel(secret, "iv", nil, 12))
	return nil
}

// update moves to the next traffic secret (RFC 8446, 7.2), forgetting
// the one before.
func (h *halfConn) update() error {
	old := h.secret
	if err := h.setSecret(h.s, expandLabel(old, "traffic upd", nil, hashLen)); err != nil {
		return err
	}
	clear(old)
	return nil
}

func (h *halfConn) nonce() []byte {
	n := h.iv
	var sq [8]byte
	binary.BigEndian.PutUint64(sq[:], h.seq)
	for i := range sq {
		n[4+i] ^= sq[i]
	}
	return n[:]
}

// seal appends a protected record of content type typ carrying p to dst.
func (h *halfConn) seal(dst []byte, typ uint8, p []byte) []byte {
	n := len(p) + 1 + h.aead.Overhead()
	dst = slices.Grow(dst, recordHeaderLen+n)
	dst = append(dst, recordApplicationData, 3, 3, byte(n>>8), byte(n))
	hdr := dst[len(dst)-recordHeaderLen:]
	start := len(dst)
	dst = append(dst, p...)
	dst = append(dst, typ)
	out := h.aead.Seal(dst[start:start], h.nonce(), dst[start:], hdr)
	h.seq++
	return dst[:start+len(out)]
}

// open authenticates and decrypts a protected record in place, returning
// its content type and content.
func (h *halfConn) open(hdr, body []byte) (uint8, []byte, alert) {
	if h.seq == 1<<64-1 {
		return 0, nil, alertInternalError
	}
	p, err := h.aead.Open(body[:0], h.nonce(), body, hdr)
	if err != nil {
		return 0, nil, alertBadRecordMAC
	}
	h.seq++
	// TLSInnerPlaintext (content, type and zero padding) is at most
	// 2^14 + 1 bytes (RFC 8446, 5.2 and 5.4): padding does not stretch
	// the limit.
	if len(p) > maxPlaintext+1 {
		return 0, nil, alertRecordOverflow
	}
	i := len(p) - 1
	for i >= 0 && p[i] == 0 {
		i--
	}
	if i < 0 {
		return 0, nil, alertUnexpectedMessage
	}
	return p[i], p[:i], alertNone
}

// Conn is a TLS 1.3 connection authenticated by a pre-shared key, after
// its handshake. It implements net.Conn.
type Conn struct {
	conn net.Conn

	rmu  sync.Mutex
	in   halfConn
	hdr  [recordHeaderLen]byte
	rbuf []byte
	data []byte // decrypted application data not yet read
	hs   []byte // post-handshake message bytes (KeyUpdate)
	rerr error
	// idle counts the records read since the last one that carried
	// application data (maxIdleRecords).
	idle int

	// updateOwed: the client asked for a KeyUpdate, which the next
	// write sends first (RFC 8446, 4.6.3): requests the server has not
	// answered yet get one update, not one each.
	updateOwed atomic.Bool

	wmu       sync.Mutex
	out       halfConn
	wbuf      []byte
	wchunk    []byte
	werr      error
	closeSent bool

	identity string
	suite    uint16
}

// Identity is the PSK identity the client authenticated with.
func (c *Conn) Identity() string { return c.identity }

// CipherSuite is the suite negotiated.
func (c *Conn) CipherSuite() uint16 { return c.suite }

// NetConn is the connection under c.
func (c *Conn) NetConn() net.Conn { return c.conn }

func (c *Conn) LocalAddr() net.Addr                { return c.conn.LocalAddr() }
func (c *Conn) RemoteAddr() net.Addr               { return c.conn.RemoteAddr() }
func (c *Conn) SetDeadline(t time.Time) error      { return c.conn.SetDeadline(t) }
func (c *Conn) SetReadDeadline(t time.Time) error  { return c.conn.SetReadDeadline(t) }
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.conn.SetWriteDeadline(t) }

// readRecord reads one record's header and body from r into buf, checking
// its length against the limit for protected (encrypted) or plaintext
// records. It is the only reader of the wire; it does not read past the
// record.
func readRecord(r io.Reader, hdr *[recordHeaderLen]byte, buf []byte, protected bool) (typ uint8, body, nbuf []byte, a alert, err error) {
	if _, err = io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, buf, alertDecodeError, err
		}
		return 0, nil, buf, alertNone, err
	}
	typ = hdr[0]
	n := int(binary.BigEndian.Uint16(hdr[3:]))
	limit := maxPlaintext
	if protected && typ == recordApplicationData {
		limit = maxCiphertext
	}
	switch {
	case hdr[1] != 3:
		return 0, nil, buf, alertProtocolVersion, errors.New("not a TLS record")
	case n > limit:
		return 0, nil, buf, alertRecordOverflow, fmt.Errorf("a record of %d bytes", n)
	case n == 0 && typ != recordApplicationData:
		return 0, nil, buf, alertDecodeError, errors.New("an empty record")
	}
	if cap(buf) < n {
		buf = make([]byte, n, maxCiphertext)
	}
	body = buf[:n]
	if _, err = io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, buf, alertDecodeError, err
	}
	return typ, body, buf, alertNone, nil
}

// maxIdleRecords bounds the records in a row that carry no application
// data (empty ones, KeyUpdates, user_canceled): each costs the server a
// decryption (and a KeyUpdate a key derivation) for a few bytes of the
// client's, with no progress for the reader. Like crypto/tls's bound on
// empty records, far above what a client sends between two requests.
const maxIdleRecords = 32

// readProtected reads and opens one protected record; plaintext records
// are refused (after the handshake nothing is sent in clear).
func (c *Conn) readProtected() (uint8, []byte, error) {
	typ, body, buf, a, err := readRecord(c.conn, &c.hdr, c.rbuf, true)
	c.rbuf = buf
	if err != nil {
		return 0, nil, c.fail(a, err)
	}
	if typ != recordApplicationData {
		return 0, nil, c.fail(alertUnexpectedMessage, fmt.Errorf("an unprotected record of type %d", typ))
	}
	t, p, a := c.in.open(c.hdr[:], body)
	if a != alertNone {
		return 0, nil, c.fail(a, errors.New("a record failed authentication"))
	}
	return t, p, nil
}

// fail sends alert a (if not alertNone) and makes the error sticky.
func (c *Conn) fail(a alert, err error) error {
	if a == alertNone {
		if c.rerr == nil {
			c.rerr = err
		}
		return c.rerr
	}
	e := &AlertError{Alert: uint8(a), Sent: true, Reason: err.Error()}
	c.sendAlert(a)
	if c.rerr == nil {
		c.rerr = e
	}
	return c.rerr
}

func (c *Conn) sendAlert(a alert) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return
	}
	c.wbuf = c.out.seal(c.wbuf[:0], recordAlert, []byte{a.level(), byte(a)})
	c.conn.Write(c.wbuf)
	if a == alertCloseNotify {
		c.closeSent = true
		c.werr = net.ErrClosed
	} else {
		c.werr = fmt.Errorf("tlspsk: connection failed (sent %s)", a)
	}
}

// Read reads application data.
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.data) == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		if len(p) == 0 {
			return 0, nil
		}
		if c.idle >= maxIdleRecords {
			return 0, c.fail(alertUnexpectedMessage, fmt.Errorf("%d records in a row without application data", c.idle))
		}
		typ, body, err := c.readProtected()
		if err != nil {
			return 0, err
		}
		c.idle++
		switch typ {
		case recordApplicationData:
			if len(c.hs) > 0 {
				return 0, c.fail(alertUnexpectedMessage, errors.New("application data inside a handshake message"))
			}
			c.data = body
		case recordAlert:
			if err := c.gotAlert(body); err != nil {
				return 0, err
			}
		case recordHandshake:
			if err := c.postHandshake(body); err != nil {
				return 0, err
			}
		default:
			return 0, c.fail(alertUnexpectedMessage, fmt.Errorf("a record of type %d", typ))
		}
	}
	c.idle = 0
	n := copy(p, c.data)
	c.data = c.data[n:]
	return n, nil
}

func (c *Conn) gotAlert(body []byte) error {
	if len(body) != 2 {
		return c.fail(alertDecodeError, errors.New("a malformed alert"))
	}
	switch alert(body[1]) {
	case alertCloseNotify:
		c.rerr = io.EOF
		return io.EOF
	case alertUserCanceled:
		return nil // close_notify follows
	}
	c.rerr = &AlertError{Alert: body[1]}
	return c.rerr
}

// postHandshake takes handshake messages after the handshake: KeyUpdate
// only.
func (c *Conn) postHandshake(body []byte) error {
	c.hs = append(c.hs, body...)
	for len(c.hs) >= 4 {
		n := int(c.hs[1])<<16 | int(c.hs[2])<<8 | int(c.hs[3])
		if c.hs[0] != typeKeyUpdate {
			return c.fail(alertUnexpectedMessage, fmt.Errorf("handshake message %d after the handshake", c.hs[0]))
		}
		if n != 1 {
			return c.fail(alertDecodeError, errors.New("a malformed KeyUpdate"))
		}
		if len(c.hs) < 5 {
			return nil
		}
		req := c.hs[4]
		if req > 1 {
			return c.fail(alertIllegalParameter, errors.New("a malformed KeyUpdate"))
		}
		if len(c.hs) != 5 {
			// The key changes after this message: nothing may follow
			// it in the record.
			return c.fail(alertUnexpectedMessage, errors.New("data after a KeyUpdate in its record"))
		}
		c.hs = c.hs[:0]
		if err := c.in.update(); err != nil {
			return c.fail(alertInternalError, err)
		}
		if req == 1 {
			// Answered before the next write's data (WriteBuffers),
			// not here: the reader does not wait on a peer that does
			// not read, and many requests get one answer.
			c.updateOwed.Store(true)
		}
	}
	if len(c.hs) > maxPlaintext {
		return c.fail(alertUnexpectedMessage, errors.New("an oversized handshake message"))
	}
	return nil
}

// keyUpdateLocked sends KeyUpdate(update_not_requested) and switches the
// sending key.
func (c *Conn) keyUpdateLocked() error {
	if c.werr != nil {
		return c.werr
	}
	c.wbuf = c.out.seal(c.wbuf[:0], recordHandshake, []byte{typeKeyUpdate, 0, 0, 1, 0})
	if _, err := c.conn.Write(c.wbuf); err != nil {
		c.werr = err
		return err
	}
	if err := c.out.update(); err != nil {
		c.werr = err
		return err
	}
	return nil
}

// maxWriteBuf is how many bytes of records a write gathers before it hands
// them to the socket.
const maxWriteBuf = 256 << 10

// Write writes p as application data.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.WriteBuffers([][]byte{p})
	return int(n), err
}

// WriteBuffers writes the buffers as application data in as few records
// (of up to 16 KiB) and system calls as they allow.
func (c *Conn) WriteBuffers(v [][]byte) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return 0, c.werr
	}
	var total, sent int64
	if c.wchunk == nil {
		c.wchunk = make([]byte, maxPlaintext)
	}
	chunk := c.wchunk
	k := 0
	out := c.wbuf[:0]
	flush := func() error {
		if len(out) == 0 {
			return nil
		}
		_, err := c.conn.Write(out)
		out = out[:0]
		if err != nil {
			c.werr = err
			return err
		}
		sent = total
		return nil
	}
	if c.updateOwed.Swap(false) {
		if err := c.keyUpdateLocked(); err != nil {
			return 0, err
		}
	}
	seal := func(p []byte) error {
		if c.out.seq >= keyUpdateAfter {
			if err := flush(); err != nil {
				return err
			}
			if err := c.keyUpdateLocked(); err != nil {
				return err
			}
		}
		out = c.out.seal(out, recordApplicationData, p)
		total += int64(len(p))
		if len(out) >= maxWriteBuf {
			return flush()
		}
		return nil
	}
	for _, b := range v {
		for len(b) > 0 {
			if k == 0 && len(b) >= maxPlaintext {
				if err := seal(b[:maxPlaintext]); err != nil {
					return sent, err
				}
				b = b[maxPlaintext:]
				continue
			}
			n := copy(chunk[k:], b)
			k += n
			b = b[n:]
			if k == maxPlaintext {
				if err := seal(chunk[:k]); err != nil {
					return sent, err
				}
				k = 0
			}
		}
	}
	if k > 0 {
		if err := seal(chunk[:k]); err != nil {
			return sent, err
		}
	}
	err := flush()
	if cap(out) <= 2*maxWriteBuf {
		c.wbuf = out[:0]
	}
	return sent, err
}

// CloseWrite sends close_notify; the connection stays open for reading.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	sent := c.closeSent
	c.wmu.Unlock()
	if sent {
		return nil
	}
	c.sendAlert(alertCloseNotify)
	return nil
}

// closeNotifyTimeout bounds how long Close waits for the peer to take
// close_notify.
const closeNotifyTimeout = 5 * time.Second

// Close sends close_notify, unless sent or the connection failed, and
// closes the connection under c. A write in progress (blocked on a peer
// that does not read) is not waited for: the connection is closed under
// it, without close_notify, as crypto/tls does; and close_notify waits at
// most closeNotifyTimeout.
func (c *Conn) Close() error {
	if c.wmu.TryLock() {
		sent := c.closeSent || c.werr != nil
		c.wmu.Unlock()
		if !sent {
			c.conn.SetWriteDeadline(time.Now().Add(closeNotifyTimeout))
			c.sendAlert(alertCloseNotify)
		}
	}
	return c.conn.Close()
}
