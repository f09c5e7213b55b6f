package tlspsk

import (
	"io"
)

// PeekHello reads the client's first handshake message from r, record by
// record and not a byte further, and reports whether it is a TLS 1.3
// ClientHello offering a pre-shared key whose identity keys holds: a
// server that also speaks TLS with certificates (crypto/tls) hands the
// connection to Handshake then, and to crypto/tls otherwise, replaying
// read to either. Whatever is not such a ClientHello (a malformed one, a
// record of another type) is psk == false with no error, for the other
// handshake to refuse; err is only a read error, and read holds what was
// read before it.
func PeekHello(r io.Reader, keys *Keys) (read []byte, psk bool, err error) {
	var hdr [recordHeaderLen]byte
	var msg []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return append(read, hdr[:]...), false, err
		}
		read = append(read, hdr[:]...)
		n := int(hdr[3])<<8 | int(hdr[4])
		if hdr[0] != recordHandshake || n > maxPlaintext || n == 0 {
			return read, false, nil
		}
		start := len(read)
		read = append(read, make([]byte, n)...)
		if k, err := io.ReadFull(r, read[start:]); err != nil {
			return read[:start+k], false, err
		}
		msg = append(msg, read[start:]...)
		if len(msg) < 4 {
			continue
		}
		mlen := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
		if msg[0] != typeClientHello || mlen > maxHandshakeMessage {
			return read, false, nil
		}
		if len(msg) >= 4+mlen {
			break
		}
	}
	if keys.Len() == 0 {
		return read, false, nil
	}
	ch, a := parseClientHello(msg)
	if a != alertNone || !ch.hasPSK || !ch.offersTLS13() {
		return read, false, nil
	}
	_, _, ok := ch.knownIdentity(keys)
	return read, ok, nil
}
