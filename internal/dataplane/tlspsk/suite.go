package tlspsk

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"hash"

	"golang.org/x/crypto/chacha20poly1305"
)

// Cipher suites (RFC 8446, B.4).
const (
	TLS_AES_128_GCM_SHA256       uint16 = 0x1301
	TLS_AES_256_GCM_SHA384       uint16 = 0x1302
	TLS_CHACHA20_POLY1305_SHA256 uint16 = 0x1303
)

type suite struct {
	id     uint16
	keyLen int
	hash   func() hash.Hash
	size   int // the hash's output length
	aead   func(key []byte) (cipher.AEAD, error)
}

func gcm(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// suites in the server's order of preference, for the client's order to
// override among those of the PSK's hash.
var suites = []*suite{
	{TLS_AES_128_GCM_SHA256, 16, sha256.New, sha256.Size, gcm},
	{TLS_CHACHA20_POLY1305_SHA256, chacha20poly1305.KeySize, sha256.New, sha256.Size, chacha20poly1305.New},
	{TLS_AES_256_GCM_SHA384, 32, sha512.New384, sha512.Size384, gcm},
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
func (s *suite) expandLabel(secret []byte, label string, context []byte, n int) []byte {
	info := make([]byte, 0, 4+6+len(label)+len(context))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(6+len(label)))
	info = append(info, "tls13 "...)
	info = append(info, label...)
	info = append(info, byte(len(context)))
	info = append(info, context...)
	out, err := hkdf.Expand(s.hash, secret, string(info), n)
	if err != nil {
		panic("tlspsk: HKDF-Expand: " + err.Error()) // only for n > 255*hash size
	}
	return out
}

func (s *suite) extract(ikm, salt []byte) []byte {
	if ikm == nil {
		ikm = make([]byte, s.size)
	}
	out, err := hkdf.Extract(s.hash, ikm, salt)
	if err != nil {
		panic("tlspsk: HKDF-Extract: " + err.Error())
	}
	return out
}

// deriveSecret is Derive-Secret with the transcript's hash given.
func (s *suite) deriveSecret(secret []byte, label string, transcriptHash []byte) []byte {
	return s.expandLabel(secret, label, transcriptHash, s.size)
}

func (s *suite) transcriptHash(msgs ...[]byte) []byte {
	h := s.hash()
	for _, m := range msgs {
		h.Write(m)
	}
	return h.Sum(nil)
}

func (s *suite) emptyHash() []byte { return s.transcriptHash() }

// finished computes a Finished verify_data (and a binder) from a base key.
func (s *suite) finished(baseKey, transcriptHash []byte) []byte {
	m := hmac.New(s.hash, s.expandLabel(baseKey, "finished", nil, s.size))
	m.Write(transcriptHash)
	return m.Sum(nil)
}
