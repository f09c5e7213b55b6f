package tlspsk

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// sealPadded is halfConn.seal with zero padding after the content type
// (RFC 8446, 5.4).
func sealPadded(h *halfConn, typ uint8, p []byte, pad int) []byte {
	inner := append(append(append([]byte(nil), p...), typ), make([]byte, pad)...)
	n := len(inner) + h.aead.Overhead()
	hdr := []byte{recordApplicationData, 3, 3, byte(n >> 8), byte(n)}
	out := h.aead.Seal(append([]byte(nil), hdr...), h.nonce(), inner, hdr)
	h.seq++
	return out
}

// TestRecordLimits: what a client could do with records that are each
// valid on their own.
func TestRecordLimits(t *testing.T) {
	t.Run("padding is allowed", func(t *testing.T) {
		cl, done := dialTest(t)
		cl.c.Write(sealPadded(&cl.out, recordApplicationData, []byte("hi\n"), 200))
		if typ, p := cl.read(); typ != recordApplicationData || string(p) != "echo: hi\n" {
			t.Fatalf("got record %d %q", typ, p)
		}
		cl.c.Close()
		<-done
	})
	// TLSInnerPlaintext is at most 2^14 + 1 bytes, padding included
	// (RFC 8446, 5.2): full content plus padding is an overflow.
	t.Run("16 KiB of content padded past the limit", func(t *testing.T) {
		cl, done := dialTest(t)
		cl.echo("hello")
		go cl.c.Write(sealPadded(&cl.out, recordApplicationData, make([]byte, maxPlaintext), 16))
		cl.expectAlert(alertRecordOverflow)
		var ae *AlertError
		if err := <-done; !errors.As(err, &ae) || alert(ae.Alert) != alertRecordOverflow {
			t.Fatalf("server: %v", err)
		}
	})
	// Many KeyUpdates asking for the server's own get one answer, before
	// the server's next data: the client cannot make it send a record
	// (and derive a key) per record of its own, nor block its reader on
	// writes the client does not read.
	t.Run("many key update requests, one answer", func(t *testing.T) {
		cl, done := dialTest(t)
		cl.echo("hello")
		go func() {
			for range 10 {
				cl.c.Write(cl.out.seal(nil, recordHandshake, []byte{typeKeyUpdate, 0, 0, 1, 1}))
				cl.out.update()
			}
			cl.c.Write(cl.out.seal(nil, recordApplicationData, []byte("after\n")))
		}()
		typ, p := cl.read()
		if typ != recordHandshake || len(p) != 5 || p[0] != typeKeyUpdate || p[4] != 0 {
			t.Fatalf("got record %d %x, want the server's KeyUpdate", typ, p)
		}
		cl.in.update()
		if typ, p := cl.read(); typ != recordApplicationData || string(p) != "echo: after\n" {
			t.Fatalf("got record %d %q, want the echo after one KeyUpdate", typ, p)
		}
		cl.echo("again")
		cl.c.Close()
		<-done
	})
	// Records that carry no data (empty ones, KeyUpdates, user_canceled)
	// are taken a few at a time, not without end.
	for _, tc := range []struct {
		name   string
		record func(cl *testClient) []byte
	}{
		{"empty records", func(cl *testClient) []byte { return cl.out.seal(nil, recordApplicationData, nil) }},
		{"user_canceled alerts", func(cl *testClient) []byte { return cl.out.seal(nil, recordAlert, []byte{1, byte(alertUserCanceled)}) }},
		{"key updates", func(cl *testClient) []byte {
			r := cl.out.seal(nil, recordHandshake, []byte{typeKeyUpdate, 0, 0, 1, 0})
			cl.out.update()
			return r
		}},
	} {
		t.Run("a flood of "+tc.name, func(t *testing.T) {
			cl, done := dialTest(t)
			cl.echo("hello")
			// A few are fine.
			for range 5 {
				cl.c.Write(tc.record(cl))
			}
			cl.echo("still here")
			go func() {
				for range 10 * maxIdleRecords {
					if _, err := cl.c.Write(tc.record(cl)); err != nil {
						return
					}
				}
			}()
			cl.expectAlert(alertUnexpectedMessage)
			var ae *AlertError
			if err := <-done; !errors.As(err, &ae) || alert(ae.Alert) != alertUnexpectedMessage {
				t.Fatalf("server: %v", err)
			}
		})
	}
}

// TestCloseDuringWrite: Close does not wait for a write blocked on a
// client that does not read (it would hang for ever): it closes the
// connection under it, as crypto/tls does.
func TestCloseDuringWrite(t *testing.T) {
	closeNow := make(chan struct{})
	closed := make(chan error, 1)
	cl, done := dialServe(t, func(c *Conn) error {
		go func() {
			<-closeNow
			closed <- c.Close()
		}()
		_, err := c.Write(make([]byte, 1<<20))
		return err
	})
	// The write has begun (and waits for the client to read on).
	var hdr [5]byte
	if _, err := io.ReadFull(cl.c, hdr[:]); err != nil {
		t.Fatal(err)
	}
	close(closeNow)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Close waits for a write the client does not read")
	}
	if err := <-done; err == nil {
		t.Fatal("the write went through")
	}
}

// selectedIdentity is the ServerHello's pre_shared_key, or -1.
func selectedIdentity(sh []byte) int {
	x := cryptobyte.String(sh[4+2+32:])
	var sid, exts cryptobyte.String
	var suite uint16
	var comp uint8
	if !x.ReadUint8LengthPrefixed(&sid) || !x.ReadUint16(&suite) || !x.ReadUint8(&comp) || !x.ReadUint16LengthPrefixed(&exts) {
		return -1
	}
	for !exts.Empty() {
		var et, idx uint16
		var ed cryptobyte.String
		if !exts.ReadUint16(&et) || !exts.ReadUint16LengthPrefixed(&ed) {
			return -1
		}
		if et == extPreSharedKey && ed.ReadUint16(&idx) {
			return int(idx)
		}
	}
	return -1
}

// expectPlainAlert reads an unprotected record: alert want.
func expectPlainAlert(t *testing.T, cli net.Conn, done <-chan error, want alert) {
	t.Helper()
	typ, body := readPlainRecord(t, cli)
	if typ != recordAlert || len(body) != 2 || alert(body[1]) != want {
		t.Fatalf("got record %d %x, want alert %s", typ, body, want)
	}
	var ae *AlertError
	if err := <-done; !errors.As(err, &ae) || alert(ae.Alert) != want {
		t.Fatalf("server: %v", err)
	}
}

// TestBinderIndex: the binder verified is the one at the index of the
// identity whose key is used, whatever else the lists hold.
func TestBinderIndex(t *testing.T) {
	alice, _ := hex.DecodeString(testKeyHex)
	t.Run("an unknown identity, then a known one", func(t *testing.T) {
		h := defaultHello()
		h.psks = []offeredPSK{{"mallory", nil}, {testIdentity, alice}}
		cli, done := handshakeWith(t)
		go cli.Write(plainRecord(nil, recordHandshake, h.build(t)))
		typ, sh := readPlainRecord(t, cli)
		if typ != recordHandshake || sh[0] != typeServerHello || selectedIdentity(sh) != 1 {
			t.Fatalf("got record %d %x, want a ServerHello selecting identity 1", typ, sh)
		}
		cli.Close()
		<-done
	})
	for _, tc := range []struct {
		name  string
		edit  func(h *hello)
		alert alert
	}{
		// The valid binder sits at the unknown identity's index.
		{"binders in the other order", func(h *hello) {
			h.psks, h.swapBinders = []offeredPSK{{"mallory", nil}, {testIdentity, alice}}, true
		}, alertDecryptError},
		// The first known identity is the one used, and its binder is
		// checked, not the next one's.
		{"a known identity without its key, then one with it", func(h *hello) {
			h.psks = []offeredPSK{{"bob", nil}, {testIdentity, alice}}
		}, alertDecryptError},
		{"an identity twice, the first binder wrong", func(h *hello) {
			h.psks = []offeredPSK{{testIdentity, nil}, {testIdentity, alice}}
		}, alertDecryptError},
		{"more binders than identities", func(h *hello) { h.extraBinder = true }, alertIllegalParameter},
		{"more identities than binders (the last binder dropped)", func(h *hello) {
			h.psks = []offeredPSK{{testIdentity, alice}, {"mallory", nil}}
		}, alertIllegalParameter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := defaultHello()
			tc.edit(&h)
			ch := h.build(t)
			if strings.HasPrefix(tc.name, "more identities") {
				ch = dropLastBinder(t, ch)
			}
			cli, done := handshakeWith(t)
			go cli.Write(plainRecord(nil, recordHandshake, ch))
			expectPlainAlert(t, cli, done, tc.alert)
		})
	}
}

// dropLastBinder removes the last (32-byte) binder of a hello, fixing
// the lengths.
func dropLastBinder(t *testing.T, ch []byte) []byte {
	t.Helper()
	out := append([]byte(nil), ch[:len(ch)-33]...)
	fix := func(at, n int) { // a length field of n bytes at at, less 33
		v := 0
		for i := range n {
			v = v<<8 | int(out[at+i])
		}
		v -= 33
		for i := n - 1; i >= 0; i-- {
			out[at+i] = byte(v)
			v >>= 8
		}
	}
	fix(1, 3) // the message
	// The extensions block, the pre_shared_key extension and the binders
	// list: find them by walking the hello.
	x := cryptobyte.String(out[4+2+32:])
	var sid, cs, comp cryptobyte.String
	x.ReadUint8LengthPrefixed(&sid)
	x.ReadUint16LengthPrefixed(&cs)
	x.ReadUint8LengthPrefixed(&comp)
	extsAt := len(out) - len(x)
	fix(extsAt, 2)
	at := extsAt + 2
	for at < len(out) {
		typ := int(out[at])<<8 | int(out[at+1])
		n := int(out[at+2])<<8 | int(out[at+3])
		if typ == extPreSharedKey {
			fix(at+2, 2)
			ids := int(out[at+4])<<8 | int(out[at+5])
			fix(at+6+ids, 2)
			break
		}
		at += 4 + n
	}
	return out
}

// retried sends a hello whose only share is of a group the server does
// not take, and returns the HelloRetryRequest's transcript (message_hash
// of the first hello, then the retry request) for the second hello's
// binder.
func retried(t *testing.T, cli net.Conn) []byte {
	t.Helper()
	h := defaultHello()
	h.groups, h.shares = []uint16{0x0100, groupX25519}, []uint16{}
	ch1 := h.build(t)
	go cli.Write(plainRecord(nil, recordHandshake, ch1))
	typ, hrr := readPlainRecord(t, cli)
	if typ != recordHandshake || hrr[0] != typeServerHello || !bytes.Equal(hrr[6:38], helloRetryRandom) {
		t.Fatalf("no HelloRetryRequest: %d %x", typ, hrr)
	}
	prefix := append([]byte{typeMessageHash, 0, 0, byte(hashLen)}, transcriptHash(ch1)...)
	return append(prefix, hrr...)
}

// TestRetryConsistency: after a HelloRetryRequest, the second hello's
// binder covers the retry's transcript (RFC 8446, 4.2.11.2), and a second
// hello that changes what it may not (4.1.2) is refused, as is a second
// retry.
func TestRetryConsistency(t *testing.T) {
	t.Run("change_cipher_spec before the second hello", func(t *testing.T) {
		cli, done := handshakeWith(t)
		h := defaultHello()
		h.prefix = retried(t, cli)
		go func() {
			cli.Write([]byte{recordChangeCipherSpec, 3, 3, 0, 1, 1})
			cli.Write(plainRecord(nil, recordHandshake, h.build(t)))
		}()
		typ, sh := readPlainRecord(t, cli)
		if typ != recordHandshake || sh[0] != typeServerHello || bytes.Equal(sh[6:38], helloRetryRandom) {
			t.Fatalf("no ServerHello after the retry: %d %x", typ, sh)
		}
		cli.Close()
		<-done
	})
	for _, tc := range []struct {
		name  string
		edit  func(h *hello, prefix []byte)
		alert alert
	}{
		{"a binder over the second hello alone", func(h *hello, _ []byte) {}, alertDecryptError},
		{"a binder over the first hello and the second", func(h *hello, _ []byte) {
			h1 := defaultHello()
			h1.groups, h1.shares = []uint16{0x0100, groupX25519}, []uint16{}
			h.prefix = h1.build(t)
		}, alertDecryptError},
		{"another session ID", func(h *hello, p []byte) { h.prefix, h.sessionID = p, []byte{1, 2, 3} }, alertIllegalParameter},
		{"still no share (a second retry)", func(h *hello, p []byte) { h.prefix, h.shares = p, nil }, alertIllegalParameter},
		{"a share of another group", func(h *hello, p []byte) {
			h.prefix, h.groups, h.shares = p, []uint16{groupX25519, groupP256}, []uint16{groupP256}
		}, alertIllegalParameter},
		{"another suite", func(h *hello, p []byte) {
			h.prefix, h.suites = p, []uint16{TLS_CHACHA20_POLY1305_SHA256}
		}, alertIllegalParameter},
		{"0-RTT early data", func(h *hello, p []byte) { h.prefix, h.early = p, true }, alertIllegalParameter},
		{"a SHA-384 binder", func(h *hello, p []byte) { h.prefix, h.sha384 = p, true }, alertDecryptError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, done := handshakeWith(t)
			prefix := retried(t, cli)
			h := defaultHello()
			tc.edit(&h, prefix)
			go cli.Write(plainRecord(nil, recordHandshake, h.build(t)))
			expectPlainAlert(t, cli, done, tc.alert)
		})
	}
}

// TestChangeCipherSpec: one, where RFC 8446 D.4 lets a client send it;
// none before the first hello, none twice, none protected.
func TestChangeCipherSpec(t *testing.T) {
	ccs := []byte{recordChangeCipherSpec, 3, 3, 0, 1, 1}
	t.Run("before the first hello", func(t *testing.T) {
		cli, done := handshakeWith(t)
		go cli.Write(ccs)
		expectPlainAlert(t, cli, done, alertUnexpectedMessage)
	})
	t.Run("twice", func(t *testing.T) {
		cli, done := handshakeWith(t)
		h := defaultHello()
		h.prefix = retried(t, cli)
		go func() {
			cli.Write(ccs)
			cli.Write(ccs)
		}()
		expectPlainAlert(t, cli, done, alertUnexpectedMessage)
	})
	t.Run("another value", func(t *testing.T) {
		cli, done := handshakeWith(t)
		retried(t, cli)
		go cli.Write([]byte{recordChangeCipherSpec, 3, 3, 0, 1, 2})
		expectPlainAlert(t, cli, done, alertUnexpectedMessage)
	})
	t.Run("after the handshake", func(t *testing.T) {
		cl, done := dialTest(t)
		cl.echo("hello")
		go cl.c.Write(ccs)
		cl.expectAlert(alertUnexpectedMessage)
		<-done
	})
}

// TestKeyChangeBoundaries: a handshake message after which the keys
// change (ClientHello, Finished) must end its record (RFC 8446, 5.1);
// before that it may span records.
func TestKeyChangeBoundaries(t *testing.T) {
	t.Run("a ClientHello with more behind it in its record", func(t *testing.T) {
		h := defaultHello()
		cli, done := handshakeWith(t)
		go cli.Write(plainRecord(nil, recordHandshake, append(h.build(t), typeFinished, 0)))
		expectPlainAlert(t, cli, done, alertUnexpectedMessage)
	})
	t.Run("a ClientHello over two records", func(t *testing.T) {
		h := defaultHello()
		ch := h.build(t)
		cli, done := handshakeWith(t)
		go func() {
			cli.Write(plainRecord(nil, recordHandshake, ch[:50]))
			cli.Write(plainRecord(nil, recordHandshake, ch[50:]))
		}()
		typ, sh := readPlainRecord(t, cli)
		if typ != recordHandshake || sh[0] != typeServerHello {
			t.Fatalf("got record %d %x, want a ServerHello", typ, sh)
		}
		cli.Close()
		<-done
	})
	t.Run("a Finished with more behind it in its record", func(t *testing.T) {
		cl, done := dialFinished(t, func(*Conn) error { return nil }, func(fin []byte) [][]byte {
			return [][]byte{append(fin, typeKeyUpdate, 0, 0, 1, 0)}
		})
		cl.expectAlert(alertUnexpectedMessage)
		var ae *AlertError
		if err := <-done; !errors.As(err, &ae) || alert(ae.Alert) != alertUnexpectedMessage {
			t.Fatalf("server: %v", err)
		}
	})
	t.Run("a Finished over two records", func(t *testing.T) {
		cl, done := dialFinished(t, func(*Conn) error { return nil }, func(fin []byte) [][]byte {
			return [][]byte{fin[:3], fin[3:]}
		})
		if err := <-done; err != nil {
			t.Fatalf("server: %v", err)
		}
		cl.c.Close()
	})
}
