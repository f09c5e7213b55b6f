package tlspsk

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"

	"golang.org/x/crypto/chacha20poly1305"
)

// Cipher suites (RFC 8446, B.4): those of SHA-256, the keys' hash.
const (
	TLS_AES_128_GCM_SHA256       uint16 = 0x1301
	TLS_CHACHA20_POLY1305_SHA256 uint16 = 0x1303
)

// Every key is bound to SHA-256, the hash psktool's keys are used with by
// GnuTLS (nbdkit, libnbd) in TLS 1.3: RFC 8446 (4.2.11) and RFC 9257 tie
// each PSK to one hash, and a key file has no field to name another. So
// the key schedule below is SHA-256's, and only SHA-256 suites are
// negotiated.
const hashLen = sha256.Size

type suite struct {
	id     uint16
	keyLen int
	aead   func(key []byte) (cipher.AEAD, error)
}

func gcm(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// suites are those of the keys' hash; the client's order picks among them.
var suites = []*suite{
	{TLS_AES_128_GCM_SHA256, 16, gcm},
	{TLS_CHACHA20_POLY1305_SHA256, chacha20poly1305.KeySize, chacha20poly1305.New},
}

func suiteByID(id uint16) *suite {
	for _, s := range suites {
		if s.id == id {
			return s
		}
	}
	return nil
}

// expandLabel is HKDF-Expand-Label (RFC 8446, 7.1).
func expandLabel(secret []byte, label string, context []byte, n int) []byte {
	info := make([]byte, 0, 4+6+len(label)+len(context))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(6+len(label)))
	info = append(info, "tls13 "...)
	info = append(info, label...)
	info = append(info, byte(len(context)))
	info = append(info, context...)
	out, err := hkdf.Expand(sha256.New, secret, string(info), n)
	if err != nil {
		panic("tlspsk: HKDF-Expand: " + err.Error()) // only for n > 255*hashLen
	}
	return out
}

func extract(ikm, salt []byte) []byte {
	if ikm == nil {
		ikm = make([]byte, hashLen)
	}
	out, err := hkdf.Extract(sha256.New, ikm, salt)
	if err != nil {
		panic("tlspsk: HKDF-Extract: " + err.Error())
	}
	return out
}

// deriveSecret is Derive-Secret with the transcript's hash th given.
func deriveSecret(secret []byte, label string, th []byte) []byte {
	return expandLabel(secret, label, th, hashLen)
}

func transcriptHash(msgs ...[]byte) []byte {
	h := sha256.New()
	for _, m := range msgs {
		h.Write(m)
	}
	return h.Sum(nil)
}

func emptyHash() []byte { return transcriptHash() }

// finished computes a Finished verify_data (and a binder) from a base key
// and a transcript hash.
func finished(baseKey, th []byte) []byte {
	m := hmac.New(sha256.New, expandLabel(baseKey, "finished", nil, hashLen))
	m.Write(th)
	return m.Sum(nil)
}
