package nbd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/rialto-project/rialto/internal/dataplane/tlspsk"
)

var errAbort = errors.New("nbd: client aborted the handshake")

// session is the outcome of a successful option phase.
type session struct {
	name       string
	exp        *export
	structured bool
	meta       bool // base:allocation selected for this export
	flags      uint16
	// After NBD_OPT_STARTTLS: the TLS connection and the reader over it,
	// which the transmission phase uses instead of the socket's.
	tls *tls.Conn
	psk *tlspsk.Conn // instead of tls, after a handshake with a pre-shared key
	r   *bufio.Reader
	rec *recordReader // the socket's bytes as crypto/tls takes them
}

// encrypted reports whether the session runs over TLS, with certificates
// (crypto/tls) or a pre-shared key (tlspsk).
func (s *session) encrypted() bool { return s.tls != nil || s.psk != nil }

func newConnReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, connReadBuf) }

// connReadBuf is a connection's read buffer in the transmission phase.
const connReadBuf = 64 << 10

// newHandshakeReader is the option phase's reader over r: a small buffer,
// so that a connection whose peer has not yet entered transmission (has
// presented no export name, the credential) holds little (Server.MaxHandshakes).
func newHandshakeReader(r io.Reader) *bufio.Reader {
	return bufio.NewReaderSize(r, handshakeReadBuf)
}

// transmissionReader returns the transmission phase's reader over src,
// which r, the option phase's smaller reader, has read until now: the
// bytes r read ahead (a client that sent requests right behind its
// NBD_OPT_EXPORT_NAME) are in the new reader's buffer before it returns,
// so that code that reads the socket directly once the buffer is empty
// (splice) misses none of them. Those connections read the socket
// through an io.MultiReader from then on; the others, nearly all (a
// client waits for NBD_OPT_GO's reply), read src as before.
func transmissionReader(r *bufio.Reader, src io.Reader) *bufio.Reader {
	if r.Size() >= connReadBuf {
		return r
	}
	n := r.Buffered()
	if n == 0 {
		return newConnReader(src)
	}
	ahead, _ := r.Peek(n)
	nr := newConnReader(io.MultiReader(bytes.NewReader(bytes.Clone(ahead)), src))
	// One read of the bytes.Reader brings them all (n <= handshakeReadBuf
	// < connReadBuf).
	nr.Peek(n)
	return nr
}

// errTooManyConns ends a handshake whose NBD_OPT_EXPORT_NAME asks for an
// export that has Server.MaxExportConns connections already (that option
// has no error reply).
var errTooManyConns = errors.New("nbd: the export has as many connections as it may")

// optWriter writes option replies.
type optWriter struct {
	w   io.Writer
	buf []byte
}

func (o *optWriter) reply(opt, typ uint32, data ...[]byte) error {
	n := 0
	for _, d := range data {
		n += len(d)
	}
	b := o.buf[:0]
	b = binary.BigEndian.AppendUint64(b, optReplyMagic)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	for _, d := range data {
		b = append(b, d...)
	}
	o.buf = b
	_, err := o.w.Write(b)
	return err
}

// negotiate runs the server side of the fixed newstyle handshake up to the
// transmission phase, reading from r (which reads nc) and writing to nc; it
// upgrades to TLS on NBD_OPT_STARTTLS. Any error means the connection must
// be closed.
func (s *Server) negotiate(nc net.Conn, r *bufio.Reader) (*session, error) {
	var w io.Writer = nc
	var tc *tls.Conn    // set once TLS is initiated
	var pc *tlspsk.Conn // or this, with a pre-shared key
	var rec *recordReader
	// Without TLS configured the server is in the spec's NOTLS mode; with
	// it, FORCEDTLS unless TLSOptional (then SELECTIVETLS with no TLS-only
	// export).
	tlsOn := s.TLSConfig != nil || s.PSK.Len() > 0
	forced := tlsOn && !s.TLSOptional
	var hello [18]byte
	binary.BigEndian.PutUint64(hello[0:], nbdMagic)
	binary.BigEndian.PutUint64(hello[8:], optMagic)
	binary.BigEndian.PutUint16(hello[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := w.Write(hello[:]); err != nil {
		return nil, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(r, cf[:]); err != nil {
		return nil, err
	}
	cflags := binary.BigEndian.Uint32(cf[:])
	if cflags&^(clientFlagFixedNewstyle|clientFlagNoZeroes) != 0 {
		return nil, fmt.Errorf("%w: unknown client flags %#x", ErrProtocol, cflags)
	}
	fixed := cflags&clientFlagFixedNewstyle != 0
	noZeroes := cflags&clientFlagNoZeroes != 0
	ow := &optWriter{w: w, buf: make([]byte, 0, 256)}
	var (
		structured bool
		metaName   string
		metaSet    bool
		hdr        [16]byte
		data       []byte
	)
	for i := 0; i < maxOptions; i++ {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, err
		}
		if binary.BigEndian.Uint64(hdr[0:]) != optMagic {
			return nil, fmt.Errorf("%w: bad option magic", ErrProtocol)
		}
		opt := binary.BigEndian.Uint32(hdr[8:])
		n := binary.BigEndian.Uint32(hdr[12:])
		if n > maxOptionData || (opt == optExportName && n > maxNameLen) {
			if opt == optExportName || !fixed || n > maxOptionSkip {
				// No error reply to send (the spec's limit on names
				// is 4096 bytes), or not worth reading: hang up.
				return nil, fmt.Errorf("%w: option %d length %d too large", ErrProtocol, opt, n)
			}
			// Read past it without holding it, and say why.
			if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
				return nil, err
			}
			msg := fmt.Sprintf("option data of %d bytes: this server takes at most %d", n, maxOptionData)
			if err := ow.reply(opt, repErrTooBig, []byte(msg)); err != nil {
				return nil, err
			}
			continue
		}
		if cap(data) < int(n) {
			data = make([]byte, n)
		}
		data = data[:n]
		if _, err := io.ReadFull(r, data); err != nil {
			return nil, err
		}
		if !fixed && opt != optExportName {
			return nil, fmt.Errorf("%w: option %d without fixed newstyle", ErrProtocol, opt)
		}
		var err error
		if forced && tc == nil && pc == nil {
			switch opt {
			case optStartTLS, optAbort:
			case optExportName:
				// It has no error reply: all the server can do is hang up.
				return nil, errTLSPlaintextExportName
			default:
				if err := ow.reply(opt, repErrTLSReqd, []byte("TLS is required: send NBD_OPT_STARTTLS")); err != nil {
					return nil, err
				}
				continue
			}
		}
		switch opt {
		case optStartTLS:
			switch {
			case !tlsOn:
				err = ow.reply(opt, repErrPolicy, []byte("TLS is not configured on this server"))
			case tc != nil || pc != nil:
				err = ow.reply(opt, repErrInvalid, []byte("TLS is already active"))
			case n != 0:
				err = ow.reply(opt, repErrInvalid)
			case r.Buffered() > 0:
				// The client must wait for the reply before it starts TLS:
				// bytes already here were sent in clear after STARTTLS and
				// must not be taken as if they had come over TLS.
				return nil, fmt.Errorf("%w: data after NBD_OPT_STARTTLS", ErrProtocol)
			default:
				if err := ow.reply(opt, repAck); err != nil {
					return nil, err
				}
				rec = newRecordReader(nc)
				var err error
				if tc, pc, err = s.startTLS(nc, rec); err != nil {
					return nil, fmt.Errorf("nbd: TLS handshake: %w", err)
				}
				// Nothing negotiated before STARTTLS survives it.
				if pc != nil {
					r, w = newHandshakeReader(pc), pc
				} else {
					r, w = newHandshakeReader(tc), tc
				}
				ow.w = w
				structured, metaSet, metaName = false, false, ""
			}

		case optExportName:
			e := s.lookup(string(data))
			if e == nil {
				return nil, ErrExportNotFound
			}
			if s.exportFull(e) {
				return nil, errTooManyConns
			}
			sess := &session{name: e.Name, exp: e, structured: structured, meta: metaSet && metaName == e.Name, tls: tc, psk: pc, r: r, rec: rec}
			sess.flags = e.transmissionFlags(structured)
			b := make([]byte, 10, 10+124)
			binary.BigEndian.PutUint64(b, uint64(e.size))
			binary.BigEndian.PutUint16(b[8:], sess.flags)
			if !noZeroes {
				b = b[:10+124]
			}
			if _, err := w.Write(b); err != nil {
				return nil, err
			}
			return sess, nil

		case optAbort:
			ow.reply(opt, repAck)
			return nil, errAbort

		case optList:
			if n != 0 {
				err = ow.reply(opt, repErrInvalid)
			} else {
				// Export names are credentials: never enumerate them.
				err = ow.reply(opt, repErrPolicy, []byte("export listing is disabled: export names are credentials"))
			}

		case optStructuredReply:
			if n != 0 {
				err = ow.reply(opt, repErrInvalid)
			} else {
				structured = true
				err = ow.reply(opt, repAck)
			}

		case optInfo, optGo:
			name, infos, ok := parseInfoRequest(data)
			if !ok {
				err = ow.reply(opt, repErrInvalid)
				break
			}
			e := s.lookup(name)
			if e == nil {
				err = ow.reply(opt, repErrUnknown)
				break
			}
			if opt == optGo && s.exportFull(e) {
				// The client may try again once one of the export's
				// connections has ended.
				err = ow.reply(opt, repErrPolicy, []byte(fmt.Sprintf(
					"the export has %d connections, as many as this server allows one export: close one first", s.maxExportConns())))
				break
			}
			flags := e.transmissionFlags(structured)
			var ib [14]byte
			binary.BigEndian.PutUint16(ib[0:], infoExport)
			binary.BigEndian.PutUint64(ib[2:], uint64(e.size))
			binary.BigEndian.PutUint16(ib[10:], flags)
			if err = ow.reply(opt, repInfo, ib[:12]); err != nil {
				return nil, err
			}
			binary.BigEndian.PutUint16(ib[0:], infoBlockSize)
			binary.BigEndian.PutUint32(ib[2:], e.MinBlock)
			binary.BigEndian.PutUint32(ib[6:], e.PrefBlock)
			binary.BigEndian.PutUint32(ib[10:], e.MaxBlock)
			if err = ow.reply(opt, repInfo, ib[:14]); err != nil {
				return nil, err
			}
			for _, t := range infos {
				if t == infoDescription && e.Description != "" {
					binary.BigEndian.PutUint16(ib[0:], infoDescription)
					if err = ow.reply(opt, repInfo, ib[:2], []byte(e.Description)); err != nil {
						return nil, err
					}
				}
			}
			if err = ow.reply(opt, repAck); err != nil {
				return nil, err
			}
			if opt == optGo {
				return &session{name: e.Name, exp: e, structured: structured,
					meta: metaSet && metaName == e.Name, flags: flags, tls: tc, psk: pc, r: r, rec: rec}, nil
			}

		case optListMetaContext, optSetMetaContext:
			if opt == optSetMetaContext {
				metaSet = false // replaced even on failure
			}
			if !structured {
				err = ow.reply(opt, repErrInvalid, []byte("structured replies not negotiated"))
				break
			}
			name, queries, ok := parseMetaRequest(data)
			if !ok {
				err = ow.reply(opt, repErrInvalid)
				break
			}
			if s.lookup(name) == nil {
				err = ow.reply(opt, repErrUnknown)
				break
			}
			match := false
			if opt == optListMetaContext && len(queries) == 0 {
				match = true
			}
			for _, q := range queries {
				if q == MetaContextBaseAllocation || (opt == optListMetaContext && q == "base:") {
					match = true
				}
			}
			if match {
				var id [4]byte
				if opt == optSetMetaContext {
					binary.BigEndian.PutUint32(id[:], metaContextID)
					metaSet, metaName = true, name
				}
				if err = ow.reply(opt, repMetaContext, id[:], []byte(MetaContextBaseAllocation)); err != nil {
					return nil, err
				}
			}
			err = ow.reply(opt, repAck)

		default: // EXTENDED_HEADERS and anything unknown
			err = ow.reply(opt, repErrUnsup)
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: too many options", ErrProtocol)
}

// startTLS runs the TLS handshake after NBD_OPT_STARTTLS, reading the
// socket through rec and writing it through nc. Without pre-shared keys it
// is crypto/tls's, with X.509 certificates, as ever. With them, the
// client's first handshake message is read first: a ClientHello offering
// one of the keys' identities goes to the PSK handshake (package
// tlspsk), anything else to crypto/tls (or, on a server without a
// certificate, to the PSK handshake, which refuses it with an alert);
// either is handed the bytes read. The handshake is bounded by the
// connection's deadline (HandshakeTimeout), and nc is closed if the
// server's context ends.
func (s *Server) startTLS(nc net.Conn, rec *recordReader) (*tls.Conn, *tlspsk.Conn, error) {
	if s.PSK.Len() == 0 {
		tc := tls.Server(&readerConn{Conn: nc, r: rec}, s.TLSConfig)
		return tc, nil, tc.Handshake()
	}
	read, psk, err := tlspsk.PeekHello(rec, s.PSK)
	if err != nil {
		return nil, nil, err
	}
	src := &readerConn{Conn: nc, r: io.MultiReader(bytes.NewReader(read), rec)}
	if psk || s.TLSConfig == nil {
		pc, err := tlspsk.Handshake(context.Background(), src, s.PSK)
		return nil, pc, err
	}
	tc := tls.Server(src, s.TLSConfig)
	return tc, nil, tc.Handshake()
}

// parseInfoRequest decodes NBD_OPT_INFO/GO data.
func parseInfoRequest(d []byte) (name string, infos []uint16, ok bool) {
	if len(d) < 6 {
		return "", nil, false
	}
	nl := binary.BigEndian.Uint32(d)
	if uint64(nl) > uint64(len(d)-6) {
		return "", nil, false
	}
	name = string(d[4 : 4+nl])
	rest := d[4+nl:]
	cnt := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*cnt {
		return "", nil, false
	}
	for i := 0; i < cnt; i++ {
		infos = append(infos, binary.BigEndian.Uint16(rest[2*i:]))
	}
	return name, infos, true
}

// parseMetaRequest decodes NBD_OPT_{LIST,SET}_META_CONTEXT data.
func parseMetaRequest(d []byte) (name string, queries []string, ok bool) {
	if len(d) < 8 {
		return "", nil, false
	}
	nl := binary.BigEndian.Uint32(d)
	if uint64(nl) > uint64(len(d)-8) {
		return "", nil, false
	}
	name = string(d[4 : 4+nl])
	rest := d[4+nl:]
	cnt := binary.BigEndian.Uint32(rest)
	rest = rest[4:]
	for i := uint32(0); i < cnt; i++ {
		if len(rest) < 4 {
			return "", nil, false
		}
		ql := binary.BigEndian.Uint32(rest)
		if uint64(ql) > uint64(len(rest)-4) {
			return "", nil, false
		}
		queries = append(queries, string(rest[4:4+ql]))
		rest = rest[4+ql:]
	}
	if len(rest) != 0 {
		return "", nil, false
	}
	return name, queries, true
}
