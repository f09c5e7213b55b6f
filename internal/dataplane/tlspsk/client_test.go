package tlspsk

import (
	"bufio"
	"crypto/hmac"
	"errors"
	"io"
	"net"
	"testing"

	"golang.org/x/crypto/cryptobyte"
)

// testClient is the client side of a finished handshake, built from the
// package's own key schedule: enough to send the server records no real
// client sends.
type testClient struct {
	t       *testing.T
	c       net.Conn
	in, out halfConn
}

// dialTest runs a handshake against an echo server (lines back with
// "echo: ") on a pipe; the server's error comes on the channel when its
// session ends.
func dialTest(t *testing.T) (*testClient, <-chan error) {
	t.Helper()
	return dialServe(t, func(c *Conn) error {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			if _, err := c.Write([]byte("echo: " + line)); err != nil {
				return err
			}
		}
	})
}

// dialServe is dialTest with the server's session given: serve's error
// comes on the channel.
func dialServe(t *testing.T, serve func(*Conn) error) (*testClient, <-chan error) {
	t.Helper()
	return dialFinished(t, serve, nil)
}

// dialFinished is dialServe sending the client's Finished as the records
// split gives (nil: one record): it returns before the client takes its
// application keys when split is not nil, for the test to read the
// server's answer under the handshake keys.
func dialFinished(t *testing.T, serve func(*Conn) error, split func(fin []byte) [][]byte) (*testClient, <-chan error) {
	t.Helper()
	cli, done := pipeServer(t, serve)
	h := defaultHello()
	ch := h.build(t)
	go cli.Write(plainRecord(nil, recordHandshake, ch))
	typ, sh := readPlainRecord(t, cli)
	if typ != recordHandshake || sh[0] != typeServerHello {
		t.Fatalf("no ServerHello: %d %x", typ, sh)
	}
	// The server's key share.
	x := cryptobyte.String(sh[4+2+32:])
	var sid, exts cryptobyte.String
	var suite uint16
	var comp uint8
	if !x.ReadUint8LengthPrefixed(&sid) || !x.ReadUint16(&suite) || !x.ReadUint8(&comp) || !x.ReadUint16LengthPrefixed(&exts) {
		t.Fatal("malformed ServerHello")
	}
	var peer []byte
	for !exts.Empty() {
		var et, g uint16
		var ed, k cryptobyte.String
		exts.ReadUint16(&et)
		exts.ReadUint16LengthPrefixed(&ed)
		if et == extKeyShare && ed.ReadUint16(&g) && ed.ReadUint16LengthPrefixed(&k) {
			peer = k
		}
	}
	pub, err := curveOf(groupX25519).NewPublicKey(peer)
	if err != nil {
		t.Fatal(err)
	}
	shared, err := h.privs[groupX25519].ECDH(pub)
	if err != nil {
		t.Fatal(err)
	}
	s := suiteByID(suite)
	early := extract(h.key, make([]byte, hashLen))
	hsSecret := extract(shared, deriveSecret(early, "derived", emptyHash()))
	transcript := append(append([]byte(nil), ch...), sh...)
	th := transcriptHash(transcript)
	cHS := deriveSecret(hsSecret, "c hs traffic", th)
	sHS := deriveSecret(hsSecret, "s hs traffic", th)
	master := extract(nil, deriveSecret(hsSecret, "derived", emptyHash()))
	tc := &testClient{t: t, c: cli}
	tc.in.setSecret(s, sHS)
	tc.out.setSecret(s, cHS)
	typ, msgs := tc.read()
	if typ != recordHandshake || len(msgs) < 6+4+hashLen || msgs[0] != typeEncryptedExtensions {
		t.Fatalf("no EncryptedExtensions and Finished: %d %x", typ, msgs)
	}
	fin := msgs[6:]
	if fin[0] != typeFinished || !hmac.Equal(fin[4:], finished(sHS, transcriptHash(transcript, msgs[:6]))) {
		t.Fatal("the server's Finished does not verify")
	}
	transcript = append(transcript, msgs...)
	th = transcriptHash(transcript)
	cfin := append([]byte{typeFinished, 0, 0, byte(hashLen)}, finished(cHS, th)...)
	if split != nil {
		go func() {
			for _, r := range split(cfin) {
				cli.Write(tc.out.seal(nil, recordHandshake, r))
			}
		}()
		return tc, done
	}
	tc.send(recordHandshake, cfin)
	tc.in.setSecret(s, deriveSecret(master, "s ap traffic", th))
	tc.out.setSecret(s, deriveSecret(master, "c ap traffic", th))
	return tc, done
}

// send seals and writes a record, which the server reads whole before
// it answers (a pipe's write waits for the reader).
func (tc *testClient) send(typ uint8, p []byte) {
	tc.t.Helper()
	if _, err := tc.c.Write(tc.out.seal(nil, typ, p)); err != nil {
		tc.t.Fatal(err)
	}
}

// read reads and opens one record.
func (tc *testClient) read() (uint8, []byte) {
	tc.t.Helper()
	var hdr [5]byte
	if _, err := io.ReadFull(tc.c, hdr[:]); err != nil {
		tc.t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(tc.c, body); err != nil {
		tc.t.Fatal(err)
	}
	typ, p, a := tc.in.open(hdr[:], body)
	if a != alertNone {
		tc.t.Fatalf("a record from the server does not open: %s (%x, seq %d)", a, hdr, tc.in.seq)
	}
	return typ, p
}

func (tc *testClient) expectAlert(want alert) {
	tc.t.Helper()
	typ, p := tc.read()
	if typ != recordAlert || len(p) != 2 || alert(p[1]) != want {
		tc.t.Fatalf("got record %d %x, want alert %s", typ, p, want)
	}
}

func (tc *testClient) echo(line string) {
	tc.t.Helper()
	tc.send(recordApplicationData, []byte(line+"\n"))
	typ, p := tc.read()
	if typ != recordApplicationData || string(p) != "echo: "+line+"\n" {
		tc.t.Fatalf("got record %d %q", typ, p)
	}
}

// TestRecordLayer: after the handshake, data flows; a close_notify ends
// the session in order; and each fault of the client's records is
// answered with its alert and ends the session.
func TestRecordLayer(t *testing.T) {
	t.Run("echo and close_notify", func(t *testing.T) {
		tc, done := dialTest(t)
		tc.echo("hello")
		tc.send(recordApplicationData, nil) // an empty record is allowed
		tc.echo("again")
		tc.send(recordAlert, []byte{1, 0})
		if err := <-done; !errors.Is(err, io.EOF) {
			t.Fatalf("server: %v, want EOF", err)
		}
	})
	t.Run("key update with data behind it in the record", func(t *testing.T) {
		tc, done := dialTest(t)
		tc.echo("hello")
		go tc.c.Write(tc.out.seal(nil, recordHandshake, []byte{typeKeyUpdate, 0, 0, 1, 0, typeKeyUpdate}))
		tc.expectAlert(alertUnexpectedMessage)
		<-done
	})
	for _, tc := range []struct {
		name  string
		raw   func(tc *testClient) []byte // the bytes to send
		alert alert
	}{
		{"a record that does not authenticate", func(tc *testClient) []byte {
			r := tc.out.seal(nil, recordApplicationData, []byte("x\n"))
			r[len(r)-1] ^= 1
			return r
		}, alertBadRecordMAC},
		{"a record over the size limit", func(tc *testClient) []byte {
			n := maxCiphertext + 1
			return append([]byte{recordApplicationData, 3, 3, byte(n >> 8), byte(n)}, make([]byte, n)...)
		}, alertRecordOverflow},
		{"content over 16 KiB", func(tc *testClient) []byte {
			return tc.out.seal(nil, recordApplicationData, make([]byte, maxPlaintext+1))
		}, alertRecordOverflow},
		{"a ClientHello after the handshake (renegotiation)", func(tc *testClient) []byte {
			h := defaultHello()
			return tc.out.seal(nil, recordHandshake, h.build(tc.t))
		}, alertUnexpectedMessage},
		{"an unprotected record", func(tc *testClient) []byte {
			return plainRecord(nil, recordHandshake, []byte{typeKeyUpdate, 0, 0, 1, 0})
		}, alertUnexpectedMessage},
		{"a malformed key update", func(tc *testClient) []byte {
			return tc.out.seal(nil, recordHandshake, []byte{typeKeyUpdate, 0, 0, 1, 2})
		}, alertIllegalParameter},
		{"padding only", func(tc *testClient) []byte {
			r := tc.out.seal(nil, 0, nil)
			return r
		}, alertUnexpectedMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, done := dialTest(t)
			cl.echo("hello")
			b := tc.raw(cl)
			go cl.c.Write(b)
			cl.expectAlert(tc.alert)
			var ae *AlertError
			if err := <-done; !errors.As(err, &ae) || alert(ae.Alert) != tc.alert {
				t.Fatalf("server: %v", err)
			}
		})
	}
	t.Run("key update asked for", func(t *testing.T) {
		cl, done := dialTest(t)
		cl.echo("hello")
		cl.send(recordHandshake, []byte{typeKeyUpdate, 0, 0, 1, 1})
		if err := cl.out.update(); err != nil {
			t.Fatal(err)
		}
		// The server's KeyUpdate comes before its next data.
		cl.send(recordApplicationData, []byte("after\n"))
		typ, p := cl.read()
		if typ != recordHandshake || len(p) != 5 || p[0] != typeKeyUpdate || p[4] != 0 {
			t.Fatalf("got record %d %x, want the server's KeyUpdate", typ, p)
		}
		cl.in.update()
		if typ, p := cl.read(); typ != recordApplicationData || string(p) != "echo: after\n" {
			t.Fatalf("got record %d %q", typ, p)
		}
		cl.echo("again")
		cl.c.Close()
		<-done
	})
}
