package tlspsk

import (
	"context"
	"crypto/ecdh"
	"crypto/hmac"
	"crypto/rand"
	"fmt"
	"net"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// Named groups the server takes key shares of, in its order of preference.
const (
	groupX25519 uint16 = 0x001d
	groupP256   uint16 = 0x0017
)

func curveOf(g uint16) ecdh.Curve {
	switch g {
	case groupX25519:
		return ecdh.X25519()
	case groupP256:
		return ecdh.P256()
	}
	return nil
}

// helloRetryRandom marks a ServerHello as a HelloRetryRequest (RFC 8446,
// 4.1.3).
var helloRetryRandom = []byte{
	0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
	0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C,
}

// maxHandshakeMessage bounds a handshake message the server buffers.
const maxHandshakeMessage = 1 << 16

// hs is a handshake in progress.
type hs struct {
	conn    net.Conn
	keys    *Keys
	hdr     [recordHeaderLen]byte
	rbuf    []byte
	msgs    []byte // handshake bytes read, not yet taken
	in, out halfConn
	ccs     int
	hello   bool // a ClientHello was read
}

// Handshake runs the server side of a TLS 1.3 handshake with a
// pre-shared key of keys over conn, whose next bytes are the client's
// first record. ctx bounds it (by the connection's deadline). On failure
// the client has been sent an alert (an *AlertError says which); the
// caller closes conn.
func Handshake(ctx context.Context, conn net.Conn, keys *Keys) (*Conn, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	h := &hs{conn: conn, keys: keys}
	c, err := h.run()
	if !stop() && err == nil {
		return nil, ctx.Err()
	}
	return c, err
}

// fail sends alert a to the client and returns the error.
func (h *hs) fail(a alert, format string, args ...any) error {
	var b []byte
	if h.out.aead == nil {
		b = []byte{recordAlert, 3, 3, 0, 2, 2, byte(a)}
	} else {
		b = h.out.seal(nil, recordAlert, []byte{2, byte(a)})
	}
	h.conn.Write(b)
	return &AlertError{Alert: uint8(a), Sent: true, Reason: fmt.Sprintf(format, args...)}
}

// readMessage returns the next handshake message, header included. The
// slice is valid until the next call.
func (h *hs) readMessage() ([]byte, error) {
	for {
		if len(h.msgs) >= 4 {
			n := int(h.msgs[1])<<16 | int(h.msgs[2])<<8 | int(h.msgs[3])
			if n > maxHandshakeMessage {
				return nil, h.fail(alertDecodeError, "a handshake message of %d bytes", n)
			}
			if len(h.msgs) >= 4+n {
				m := h.msgs[:4+n]
				h.msgs = h.msgs[4+n:]
				return m, nil
			}
		}
		typ, body, buf, a, err := readRecord(h.conn, &h.hdr, h.rbuf, h.in.aead != nil)
		h.rbuf = buf
		if err != nil {
			if a != alertNone {
				return nil, h.fail(a, "reading a record: %v", err)
			}
			return nil, fmt.Errorf("tlspsk: handshake: %w", err)
		}
		if typ == recordChangeCipherSpec {
			// Middlebox compatibility (RFC 8446, D.4): dropped.
			if len(body) != 1 || body[0] != 1 || h.ccs > 0 || len(h.msgs) > 0 || !h.hello {
				return nil, h.fail(alertUnexpectedMessage, "an unexpected change_cipher_spec")
			}
			h.ccs++
			continue
		}
		if h.in.aead != nil {
			if typ == recordAlert && len(body) == 2 {
				// A client that failed before it had keys.
				return nil, &AlertError{Alert: body[1]}
			}
			if typ != recordApplicationData {
				return nil, h.fail(alertUnexpectedMessage, "an unprotected record of type %d after the ServerHello", typ)
			}
			t, p, a := h.in.open(h.hdr[:], body)
			if a != alertNone {
				return nil, h.fail(a, "a handshake record failed authentication (is it the same key?)")
			}
			typ, body = t, p
		}
		switch typ {
		case recordHandshake:
			if len(body) == 0 {
				return nil, h.fail(alertUnexpectedMessage, "an empty handshake record")
			}
			// A copy: the record buffer is reused.
			h.msgs = append(h.msgs, body...)
		case recordAlert:
			if len(body) == 2 {
				return nil, &AlertError{Alert: body[1]}
			}
			return nil, h.fail(alertDecodeError, "a malformed alert")
		default:
			return nil, h.fail(alertUnexpectedMessage, "a record of type %d during the handshake", typ)
		}
	}
}

// readClientHello reads and parses a ClientHello, which must end its
// record (the key may change after it).
func (h *hs) readClientHello() (*clientHello, error) {
	m, err := h.readMessage()
	if err != nil {
		return nil, err
	}
	if m[0] != typeClientHello {
		return nil, h.fail(alertUnexpectedMessage, "handshake message %d instead of a ClientHello", m[0])
	}
	h.hello = true
	if len(h.msgs) != 0 {
		return nil, h.fail(alertUnexpectedMessage, "data after the ClientHello in its record")
	}
	ch, a := parseClientHello(append([]byte(nil), m...))
	if a != alertNone {
		return nil, h.fail(a, "a malformed ClientHello")
	}
	return ch, nil
}

// check refuses what this server does not do, and finds the PSK.
func (h *hs) check(ch *clientHello) (idx int, key []byte, err error) {
	if !ch.offersTLS13() {
		return 0, nil, h.fail(alertProtocolVersion, "the client does not offer TLS 1.3 (TLS with a pre-shared key needs it)")
	}
	if len(ch.compression) != 1 || ch.compression[0] != 0 {
		return 0, nil, h.fail(alertIllegalParameter, "compression offered")
	}
	if !ch.hasPSK {
		return 0, nil, h.fail(alertHandshakeFailure, "the client offered no PSK")
	}
	if !ch.hasPSKModes {
		return 0, nil, h.fail(alertMissingExtension, "pre_shared_key without psk_key_exchange_modes")
	}
	if ch.earlyData {
		return 0, nil, h.fail(alertIllegalParameter, "the client offers 0-RTT early data, which this server does not accept")
	}
	idx, key, ok := ch.knownIdentity(h.keys)
	if !ok {
		return 0, nil, h.fail(alertUnknownPSKIdentity, "the client offered no known PSK identity")
	}
	if !ch.offersMode(pskModeDHEKE) {
		return 0, nil, h.fail(alertInsufficientSecurity, "the client offers only psk_ke (a PSK without a key exchange: no forward secrecy); psk_dhe_ke is required")
	}
	if !ch.hasGroups || !ch.hasShares {
		return 0, nil, h.fail(alertMissingExtension, "no supported_groups or key_share")
	}
	return idx, key, nil
}

// pickSuite takes the client's first suite the server has (all are of
// the keys' hash, SHA-256).
func pickSuite(ch *clientHello) *suite {
	for _, id := range ch.suites {
		if s := suiteByID(id); s != nil {
			return s
		}
	}
	return nil
}

// pickShare returns the client's first usable key share, or the group to
// ask for in a HelloRetryRequest.
func pickShare(ch *clientHello) (share *keyShare, retry uint16) {
	listed := func(g uint16) bool {
		for _, x := range ch.groups {
			if x == g {
				return true
			}
		}
		return false
	}
	for i := range ch.shares {
		if g := ch.shares[i].group; curveOf(g) != nil && listed(g) {
			return &ch.shares[i], 0
		}
	}
	for _, g := range []uint16{groupX25519, groupP256} {
		if listed(g) {
			return nil, g
		}
	}
	return nil, 0
}

// verifyBinder checks the binder of identity idx against the transcript
// before it (prefix: the messages of a first hello and a retry), and
// returns the error (its alert sent) if it does not verify.
//
// A binder that does not verify gets decrypt_error: RFC 8446 says the
// server must then abort (4.2.11) and names decrypt_error for failing to
// "validate ... a PSK binder" (6.2). A binder whose length is not
// SHA-256's is one of those, not an illegal_parameter (binders of 32 to
// 255 bytes are well formed): the client uses the key with another hash
// (SHA-384: 48 bytes), and every key is bound to SHA-256 (suite.go). The
// client gets the alert a wrong key gets; the reason, for the server's
// log, tells the two apart.
func (h *hs) verifyBinder(key []byte, ch *clientHello, idx int, prefix []byte) error {
	id, binder := ch.identities[idx].identity, ch.binders[idx]
	if len(binder) != hashLen {
		return h.fail(alertDecryptError, "a binder of %d bytes for identity %s: the client uses the key with a hash other than SHA-256 (%d-byte binders), the only one this server uses keys with, as GnuTLS does", len(binder), shown(id), hashLen)
	}
	early := extract(key, make([]byte, hashLen))
	binderKey := deriveSecret(early, "ext binder", emptyHash())
	want := finished(binderKey, transcriptHash(prefix, ch.raw[:ch.bindersStart]))
	ok := hmac.Equal(want, binder)
	clear(early)
	clear(binderKey)
	if !ok {
		return h.fail(alertDecryptError, "the PSK binder does not verify: the client holds another key for identity %s", shown(id))
	}
	return nil
}

func serverHello(random, sessionID []byte, suite uint16, exts func(b *cryptobyte.Builder)) []byte {
	var b cryptobyte.Builder
	b.AddUint8(typeServerHello)
	b.AddUint24LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint16(versionTLS12)
		b.AddBytes(random)
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(sessionID) })
		b.AddUint16(suite)
		b.AddUint8(0)
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			b.AddUint16(extSupportedVersions)
			b.AddUint16(2)
			b.AddUint16(versionTLS13)
			exts(b)
		})
	})
	return b.BytesOrPanic()
}

func plainRecord(dst []byte, typ uint8, p []byte) []byte {
	dst = append(dst, typ, 3, 3, byte(len(p)>>8), byte(len(p)))
	return append(dst, p...)
}

// shown quotes an identity for an error, at most 64 bytes of it: the
// client chose it.
func shown(id []byte) string {
	if len(id) > 64 {
		return fmt.Sprintf("%q...", id[:64])
	}
	return fmt.Sprintf("%q", id)
}

func (h *hs) run() (*Conn, error) {
	ch, err := h.readClientHello()
	if err != nil {
		return nil, err
	}
	idx, key, err := h.check(ch)
	if err != nil {
		return nil, err
	}
	s := pickSuite(ch)
	if s == nil {
		return nil, h.fail(alertHandshakeFailure, "no SHA-256 cipher suite offered (TLS_AES_128_GCM_SHA256 or TLS_CHACHA20_POLY1305_SHA256): a pre-shared key is used with SHA-256 only")
	}
	if err := h.verifyBinder(key, ch, idx, nil); err != nil {
		return nil, err
	}
	var transcript []byte
	share, retry := pickShare(ch)
	if share == nil {
		if retry == 0 {
			return nil, h.fail(alertHandshakeFailure, "no key share group in common (X25519 and P-256 are offered)")
		}
		// One HelloRetryRequest, asking for a share of group retry.
		hrr := serverHello(helloRetryRandom, ch.sessionID, s.id, func(b *cryptobyte.Builder) {
			b.AddUint16(extKeyShare)
			b.AddUint16(2)
			b.AddUint16(retry)
		})
		transcript = append([]byte{typeMessageHash, 0, 0, byte(hashLen)}, transcriptHash(ch.raw)...)
		transcript = append(transcript, hrr...)
		if _, err := h.conn.Write(plainRecord(nil, recordHandshake, hrr)); err != nil {
			return nil, fmt.Errorf("tlspsk: handshake: %w", err)
		}
		ch1, id1 := ch, ch.identities[idx].identity
		if ch, err = h.readClientHello(); err != nil {
			return nil, err
		}
		if idx, key, err = h.check(ch); err != nil {
			return nil, err
		}
		switch {
		case string(ch.sessionID) != string(ch1.sessionID):
			return nil, h.fail(alertIllegalParameter, "the second ClientHello changed its session ID")
		case string(ch.identities[idx].identity) != string(id1):
			return nil, h.fail(alertIllegalParameter, "the second ClientHello changed its PSK")
		case pickSuite(ch) != s:
			return nil, h.fail(alertIllegalParameter, "the second ClientHello changed its cipher suites")
		case len(ch.shares) != 1 || ch.shares[0].group != retry:
			return nil, h.fail(alertIllegalParameter, "the second ClientHello has no single key share of the group asked for")
		}
		if err := h.verifyBinder(key, ch, idx, transcript); err != nil {
			return nil, err
		}
		share = &ch.shares[0]
	}
	peer, err := curveOf(share.group).NewPublicKey(share.data)
	if err != nil {
		return nil, h.fail(alertIllegalParameter, "a malformed key share")
	}
	priv, err := curveOf(share.group).GenerateKey(rand.Reader)
	if err != nil {
		return nil, h.fail(alertInternalError, "key share: %v", err)
	}
	shared, err := priv.ECDH(peer)
	if err != nil {
		return nil, h.fail(alertIllegalParameter, "a key share of low order")
	}
	random := make([]byte, 32)
	rand.Read(random)
	sh := serverHello(random, ch.sessionID, s.id, func(b *cryptobyte.Builder) {
		b.AddUint16(extKeyShare)
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			b.AddUint16(share.group)
			b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(priv.PublicKey().Bytes()) })
		})
		b.AddUint16(extPreSharedKey)
		b.AddUint16(2)
		b.AddUint16(uint16(idx))
	})
	transcript = append(transcript, ch.raw...)
	transcript = append(transcript, sh...)

	// The key schedule (RFC 8446, 7.1). Secrets the connection does not
	// keep are forgotten when the handshake ends (as far as Go lets one:
	// copies the runtime made are out of reach).
	early := extract(key, make([]byte, hashLen))
	defer clear(early)
	defer clear(shared)
	hsSecret := extract(shared, deriveSecret(early, "derived", emptyHash()))
	th := transcriptHash(transcript)
	cHS := deriveSecret(hsSecret, "c hs traffic", th)
	sHS := deriveSecret(hsSecret, "s hs traffic", th)
	master := extract(nil, deriveSecret(hsSecret, "derived", emptyHash()))
	defer clear(hsSecret)
	defer clear(cHS)
	defer clear(sHS)
	defer clear(master)
	if err := h.out.setSecret(s, sHS); err != nil {
		return nil, h.fail(alertInternalError, "%v", err)
	}
	if err := h.in.setSecret(s, cHS); err != nil {
		return nil, h.fail(alertInternalError, "%v", err)
	}

	ee := []byte{typeEncryptedExtensions, 0, 0, 2, 0, 0}
	transcript = append(transcript, ee...)
	sfin := append([]byte{typeFinished, 0, 0, byte(hashLen)}, finished(sHS, transcriptHash(transcript))...)
	transcript = append(transcript, sfin...)
	out := plainRecord(nil, recordHandshake, sh)
	out = h.out.seal(out, recordHandshake, append(ee, sfin...))
	if _, err := h.conn.Write(out); err != nil {
		return nil, fmt.Errorf("tlspsk: handshake: %w", err)
	}
	th = transcriptHash(transcript)
	cAP := deriveSecret(master, "c ap traffic", th)
	sAP := deriveSecret(master, "s ap traffic", th)

	m, err := h.readMessage()
	if err != nil {
		return nil, err
	}
	if m[0] != typeFinished {
		return nil, h.fail(alertUnexpectedMessage, "handshake message %d instead of the client's Finished", m[0])
	}
	if len(h.msgs) != 0 {
		return nil, h.fail(alertUnexpectedMessage, "data after the client's Finished in its record")
	}
	if !hmac.Equal(m[4:], finished(cHS, th)) {
		return nil, h.fail(alertDecryptError, "the client's Finished does not verify")
	}
	c := &Conn{conn: h.conn, identity: string(ch.identities[idx].identity), suite: s.id}
	if err := c.in.setSecret(s, cAP); err != nil {
		return nil, h.fail(alertInternalError, "%v", err)
	}
	if err := c.out.setSecret(s, sAP); err != nil {
		return nil, h.fail(alertInternalError, "%v", err)
	}
	return c, nil
}
