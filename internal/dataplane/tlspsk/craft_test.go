package tlspsk

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// suiteAES256SHA384 is TLS_AES_256_GCM_SHA384, a suite of a hash the
// server does not use keys with: never negotiated.
const suiteAES256SHA384 uint16 = 0x1302

// hello describes a ClientHello the tests build, to reach what real
// clients will not send.
type hello struct {
	identity  string
	key       []byte
	suites    []uint16
	groups    []uint16
	shares    []uint16 // groups to send a share of
	modes     []byte
	early     bool
	afterPSK  bool // an extension after pre_shared_key
	badBinder bool
	// sha384: binders as a client holding its key as a SHA-384 PSK
	// computes them (48 bytes, over a SHA-384 transcript hash).
	sha384    bool
	prefix    []byte // the transcript before it (after a HelloRetryRequest)
	privs     map[uint16]*ecdh.PrivateKey
	sessionID []byte // nil: 32 bytes of 9

	// psks, if set, are the identities offered instead of identity
	// alone, each with a binder under its key (none: a binder of
	// zeros); swapBinders reverses the binders' order, extraBinder adds
	// one (a list longer than the identities').
	psks        []offeredPSK
	swapBinders bool
	extraBinder bool
}

type offeredPSK struct {
	identity string
	key      []byte
}

func defaultHello() hello {
	k, _ := hex.DecodeString(testKeyHex)
	return hello{identity: testIdentity, key: k, suites: []uint16{TLS_AES_128_GCM_SHA256},
		groups: []uint16{groupX25519}, shares: []uint16{groupX25519}, modes: []byte{pskModeDHEKE}}
}

// build returns the ClientHello message with a valid binder (unless
// badBinder).
func (h *hello) build(t *testing.T) []byte {
	t.Helper()
	size := hashLen
	if h.sha384 {
		size = sha512.Size384
	}
	psks := h.psks
	if psks == nil {
		psks = []offeredPSK{{h.identity, h.key}}
	}
	nBinders := len(psks)
	if h.extraBinder {
		nBinders++
	}
	var b cryptobyte.Builder
	b.AddUint8(typeClientHello)
	b.AddUint24LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint16(versionTLS12)
		b.AddBytes(make([]byte, 32))
		sid := h.sessionID
		if sid == nil {
			sid = bytes.Repeat([]byte{9}, 32)
		}
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(sid) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			for _, s := range h.suites {
				b.AddUint16(s)
			}
		})
		b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddUint8(0) })
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
			ext := func(typ uint16, f func(b *cryptobyte.Builder)) {
				b.AddUint16(typ)
				b.AddUint16LengthPrefixed(f)
			}
			ext(extSupportedVersions, func(b *cryptobyte.Builder) {
				b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddUint16(versionTLS13) })
			})
			ext(extSupportedGroups, func(b *cryptobyte.Builder) {
				b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
					for _, g := range h.groups {
						b.AddUint16(g)
					}
				})
			})
			ext(extKeyShare, func(b *cryptobyte.Builder) {
				b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
					for _, g := range h.shares {
						k, err := curveOf(g).GenerateKey(rand.Reader)
						if err != nil {
							t.Fatal(err)
						}
						if h.privs == nil {
							h.privs = map[uint16]*ecdh.PrivateKey{}
						}
						h.privs[g] = k
						b.AddUint16(g)
						b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(k.PublicKey().Bytes()) })
					}
				})
			})
			ext(extPSKKeyExchangeMode, func(b *cryptobyte.Builder) {
				b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(h.modes) })
			})
			if h.early {
				ext(extEarlyData, func(*cryptobyte.Builder) {})
			}
			ext(extPreSharedKey, func(b *cryptobyte.Builder) {
				b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
					for _, p := range psks {
						b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(p.identity)) })
						b.AddUint32(0)
					}
				})
				b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
					for range nBinders {
						b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(make([]byte, size)) })
					}
				})
			})
			if h.afterPSK {
				ext(0xfafa, func(*cryptobyte.Builder) {})
			}
		})
	})
	msg := b.BytesOrPanic()
	if h.afterPSK {
		return msg
	}
	start := len(msg) - 2 - nBinders*(1+size) // the binders list
	th := transcriptHash(h.prefix, msg[:start])
	if h.sha384 {
		sum := sha512.Sum384(append(append([]byte(nil), h.prefix...), msg[:start]...))
		th = sum[:]
	}
	for i, p := range psks {
		if p.key == nil {
			continue
		}
		var binder []byte
		if h.sha384 {
			binder = sha384Binder(p.key, th)
		} else {
			early := extract(p.key, make([]byte, hashLen))
			binderKey := deriveSecret(early, "ext binder", emptyHash())
			binder = finished(binderKey, th)
		}
		if h.badBinder {
			binder[0] ^= 1
		}
		j := i
		if h.swapBinders {
			j = len(psks) - 1 - i
		}
		copy(msg[start+2+j*(1+size)+1:], binder)
	}
	return msg
}

// sha384Binder is the binder of a client that holds key as a SHA-384 PSK
// (RFC 8446, 4.2.11.2 and 7.1), over the SHA-384 transcript hash th: what
// the server refuses, computed apart from the server's SHA-256 key
// schedule.
func sha384Binder(key, th []byte) []byte {
	const n = sha512.Size384
	expandLabel := func(secret []byte, label string, context []byte) []byte {
		info := []byte{0, n, byte(len("tls13 " + label))}
		info = append(info, "tls13 "+label...)
		info = append(info, byte(len(context)))
		info = append(info, context...)
		out, err := hkdf.Expand(sha512.New384, secret, string(info), n)
		if err != nil {
			panic(err)
		}
		return out
	}
	early, err := hkdf.Extract(sha512.New384, key, make([]byte, n))
	if err != nil {
		panic(err)
	}
	empty := sha512.Sum384(nil)
	binderKey := expandLabel(early, "ext binder", empty[:])
	m := hmac.New(sha512.New384, expandLabel(binderKey, "finished", nil))
	m.Write(th)
	return m.Sum(nil)
}

// handshakeWith runs Handshake on one end of a pipe and hands the other
// to the test; the handshake's outcome comes on the channel.
func handshakeWith(t *testing.T) (net.Conn, <-chan error) {
	t.Helper()
	return pipeServer(t, func(c *Conn) error { c.Close(); return nil })
}

// pipeServer runs Handshake on one end of a pipe and, if it succeeds,
// serve; it hands the other end to the test. The handshake's error, or
// serve's, comes on the channel.
func pipeServer(t *testing.T, serve func(*Conn) error) (net.Conn, <-chan error) {
	t.Helper()
	cli, srv := net.Pipe()
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		defer srv.Close()
		c, err := Handshake(ctx, srv, testKeys(t))
		if err != nil {
			done <- err
			return
		}
		done <- serve(c)
	}()
	cli.SetDeadline(time.Now().Add(20 * time.Second))
	return cli, done
}

// readPlainRecord reads one unprotected record.
func readPlainRecord(t *testing.T, r io.Reader) (uint8, []byte) {
	t.Helper()
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatal(err)
	}
	return hdr[0], body
}

// TestCraftedRefusals: hellos no client here sends are refused with the
// alert that names the fault, before any key is used.
func TestCraftedRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(*hello)
		alert  alert
		reason string // in the server's error, if set
	}{
		{"0-RTT early data", func(h *hello) { h.early = true }, alertIllegalParameter, ""},
		{"an extension after pre_shared_key", func(h *hello) { h.afterPSK = true }, alertIllegalParameter, ""},
		{"a binder that does not verify", func(h *hello) { h.badBinder = true }, alertDecryptError, ""},
		{"no psk_key_exchange_modes value it takes", func(h *hello) { h.modes = []byte{pskModeKE, 7} }, alertInsufficientSecurity, ""},
		{"no group in common", func(h *hello) { h.groups, h.shares = []uint16{0x0100}, []uint16{} }, alertHandshakeFailure, ""},
		{"an unknown identity", func(h *hello) { h.identity = "mallory" }, alertUnknownPSKIdentity, ""},
		// Every key is bound to SHA-256 (RFC 8446, 4.2.11; RFC 9257):
		// the same key used with SHA-384 is refused, whatever suites
		// the client offers.
		{"a SHA-384 binder for a known key", func(h *hello) {
			h.sha384, h.suites = true, []uint16{suiteAES256SHA384, TLS_AES_128_GCM_SHA256}
		}, alertDecryptError, "a binder of 48 bytes"},
		{"only TLS_AES_256_GCM_SHA384, with a SHA-384 binder", func(h *hello) {
			h.sha384, h.suites = true, []uint16{suiteAES256SHA384}
		}, alertHandshakeFailure, "no SHA-256 cipher suite"},
		{"only TLS_AES_256_GCM_SHA384", func(h *hello) { h.suites = []uint16{suiteAES256SHA384} }, alertHandshakeFailure, "no SHA-256 cipher suite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := defaultHello()
			tc.edit(&h)
			cli, done := handshakeWith(t)
			go cli.Write(plainRecord(nil, recordHandshake, h.build(t)))
			typ, body := readPlainRecord(t, cli)
			if typ != recordAlert || len(body) != 2 || alert(body[1]) != tc.alert {
				t.Fatalf("got record %d %x, want alert %s", typ, body, tc.alert)
			}
			var ae *AlertError
			if err := <-done; !errors.As(err, &ae) || alert(ae.Alert) != tc.alert || !strings.Contains(ae.Reason, tc.reason) {
				t.Fatalf("server: %v, want %s (%q)", err, tc.alert, tc.reason)
			}
		})
	}
}

// TestHelloRetry: a hello with a share of a group the server does not
// take, but listing X25519, gets a HelloRetryRequest; a second hello that
// changes its PSK identity is refused.
func TestHelloRetry(t *testing.T) {
	h := defaultHello()
	h.groups, h.shares = []uint16{0x0100, groupX25519}, []uint16{}
	ch1 := h.build(t)
	cli, done := handshakeWith(t)
	go cli.Write(plainRecord(nil, recordHandshake, ch1))
	typ, hrr := readPlainRecord(t, cli)
	if typ != recordHandshake || hrr[0] != typeServerHello || !bytes.Equal(hrr[6:38], helloRetryRandom) {
		t.Fatalf("no HelloRetryRequest: %d %x", typ, hrr)
	}
	prefix := append([]byte{typeMessageHash, 0, 0, byte(hashLen)}, transcriptHash(ch1)...)
	prefix = append(prefix, hrr...)
	h2 := defaultHello()
	h2.prefix = prefix
	h2.identity = "bob"
	h2.key, _ = hex.DecodeString("00112233445566778899aabbccddeeff")
	go cli.Write(plainRecord(nil, recordHandshake, h2.build(t)))
	typ, body := readPlainRecord(t, cli)
	if typ != recordAlert || alert(body[1]) != alertIllegalParameter {
		t.Fatalf("got record %d %x, want illegal_parameter", typ, body)
	}
	if err := <-done; err == nil {
		t.Fatal("the changed hello was taken")
	}

	// The same with an unchanged identity: a ServerHello this time.
	cli, done = handshakeWith(t)
	go cli.Write(plainRecord(nil, recordHandshake, ch1))
	_, hrr = readPlainRecord(t, cli)
	prefix = append([]byte{typeMessageHash, 0, 0, byte(hashLen)}, transcriptHash(ch1)...)
	h2 = defaultHello()
	h2.prefix = append(prefix, hrr...)
	go cli.Write(plainRecord(nil, recordHandshake, h2.build(t)))
	typ, sh := readPlainRecord(t, cli)
	if typ != recordHandshake || sh[0] != typeServerHello || bytes.Equal(sh[6:38], helloRetryRandom) {
		t.Fatalf("no ServerHello after the retry: %d %x", typ, sh)
	}
	cli.Close()
	<-done
}

// TestSuiteChoice: the client's first suite the server has is taken
// (GnuTLS lists TLS_AES_256_GCM_SHA384 first, which a SHA-256 key cannot
// use); a P-256 share is taken as X25519 is.
func TestSuiteChoice(t *testing.T) {
	h := defaultHello()
	h.suites = []uint16{suiteAES256SHA384, TLS_CHACHA20_POLY1305_SHA256, TLS_AES_128_GCM_SHA256}
	h.groups, h.shares = []uint16{groupP256}, []uint16{groupP256}
	cli, done := handshakeWith(t)
	go cli.Write(plainRecord(nil, recordHandshake, h.build(t)))
	typ, sh := readPlainRecord(t, cli)
	// type, length, version, random, session ID: the suite is at 71.
	if typ != recordHandshake || sh[0] != typeServerHello || len(sh) < 73 ||
		uint16(sh[71])<<8|uint16(sh[72]) != TLS_CHACHA20_POLY1305_SHA256 {
		t.Fatalf("ServerHello %d %x", typ, sh)
	}
	cli.Close()
	<-done
}
