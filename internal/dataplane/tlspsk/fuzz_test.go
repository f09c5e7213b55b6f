package tlspsk

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// seedHellos are the ClientHello records of seed_test.go.
func seedHellos(f *testing.F) [][]byte {
	f.Helper()
	var out [][]byte
	for _, s := range seedHelloHex {
		b, err := hex.DecodeString(s)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func FuzzParseClientHello(f *testing.F) {
	for _, rec := range seedHellos(f) {
		f.Add(rec[recordHeaderLen:])
	}
	f.Add([]byte{1, 0, 0, 0})
	keys, _ := ParseKeys([]byte(testIdentity + ":" + testKeyHex))
	f.Fuzz(func(t *testing.T, msg []byte) {
		ch, a := parseClientHello(msg)
		if a != alertNone {
			return
		}
		if ch.hasPSK {
			if ch.bindersStart <= 0 || ch.bindersStart > len(msg) || len(ch.binders) != len(ch.identities) {
				t.Fatalf("bad binders: start %d of %d", ch.bindersStart, len(msg))
			}
			// The truncated hello (RFC 8446, 4.2.11.2) stops exactly
			// at the binders list, which ends the message.
			n := 2
			for _, b := range ch.binders {
				n += 1 + len(b)
			}
			if ch.bindersStart+n != len(msg) || int(msg[ch.bindersStart])<<8|int(msg[ch.bindersStart+1]) != n-2 {
				t.Fatalf("the truncated hello ends at %d, the binders list (%d bytes) at %d of %d", ch.bindersStart, n, ch.bindersStart+n, len(msg))
			}
			if idx, key, ok := ch.knownIdentity(keys); ok {
				pickSuite(ch)
				(&hs{conn: nopConn{}}).verifyBinder(key, ch, idx, nil)
			}
		}
		pickShare(ch)
	})
}

func FuzzPeekHello(f *testing.F) {
	for _, rec := range seedHellos(f) {
		f.Add(rec)
		f.Add(rec[:len(rec)/2])
	}
	keys, _ := ParseKeys([]byte(testIdentity + ":" + testKeyHex))
	f.Fuzz(func(t *testing.T, in []byte) {
		read, _, err := PeekHello(bytes.NewReader(in), keys)
		if err == nil && !bytes.HasPrefix(in, read) {
			t.Fatalf("read %d bytes that are not the input's", len(read))
		}
		if len(read) > len(in)+recordHeaderLen {
			t.Fatalf("read %d of %d bytes", len(read), len(in))
		}
	})
}

// FuzzRecordReader feeds the post-handshake record reader arbitrary bytes
// (and records sealed with the connection's key, so that the fuzzer
// reaches the inner content): it must fail cleanly, never panic.
func FuzzRecordReader(f *testing.F) {
	s := suiteByID(TLS_AES_128_GCM_SHA256)
	secret := bytes.Repeat([]byte{7}, hashLen)
	var w halfConn
	if err := w.setSecret(s, secret); err != nil {
		f.Fatal(err)
	}
	f.Add(w.seal(nil, recordApplicationData, []byte("hello")), false)
	// With sealIt, the first byte is the inner content type.
	f.Add([]byte{}, true)
	f.Add([]byte{recordHandshake, typeKeyUpdate, 0, 0, 1, 1}, true)
	f.Add([]byte{recordHandshake, typeKeyUpdate, 0, 0, 1}, true)
	f.Add([]byte{recordAlert, 1, 0}, true)
	f.Add([]byte{recordApplicationData, 'h', 'i', 0, 0}, true)
	f.Add([]byte{2, 0}, false)
	f.Add([]byte{recordAlert, 3, 3, 0, 2, 1, 0}, false)
	f.Fuzz(func(t *testing.T, in []byte, sealIt bool) {
		var w halfConn
		w.setSecret(s, secret)
		if sealIt && len(in) > 0 {
			// The first byte picks the inner content type.
			in = w.seal(nil, in[0]%32, in[1:])
		}
		c := &Conn{conn: &pipeConn{r: bytes.NewReader(in)}}
		c.in.setSecret(s, secret)
		c.out.setSecret(s, secret)
		buf := make([]byte, 1<<15)
		for i := 0; i < 64; i++ {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
}

// pipeConn is a net.Conn reading from r and discarding writes.
type pipeConn struct {
	nopConn
	r io.Reader
}

func (p *pipeConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// nopConn is a net.Conn that does nothing.
type nopConn struct{}

func (nopConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (nopConn) Write(b []byte) (int, error)      { return len(b), nil }
func (nopConn) Close() error                     { return nil }
func (nopConn) LocalAddr() net.Addr              { return nil }
func (nopConn) RemoteAddr() net.Addr             { return nil }
func (nopConn) SetDeadline(time.Time) error      { return nil }
func (nopConn) SetReadDeadline(time.Time) error  { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzParseKeys: a key file is taken whole or refused with ErrKeyFile,
// and what is taken is what the file says.
func FuzzParseKeys(f *testing.F) {
	f.Add([]byte("alice:" + testKeyHex + "\n"))
	f.Add([]byte("alice:" + testKeyHex + "\r\n\nbob:00112233445566778899AABBCCDDEEFF"))
	f.Add([]byte("a:b:c\n:\n"))
	f.Add([]byte("alice:00ff\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		k, err := ParseKeys(in)
		if err != nil {
			if !errors.Is(err, ErrKeyFile) {
				t.Fatalf("an error without ErrKeyFile: %v", err)
			}
			return
		}
		n := 0
		for _, line := range bytes.Split(in, []byte("\n")) {
			line = bytes.TrimSuffix(line, []byte("\r"))
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			n++
			id, hk, _ := bytes.Cut(line, []byte(":"))
			want, _ := hex.DecodeString(string(hk))
			key, ok := k.lookup(id)
			if !ok || !bytes.Equal(key, want) || len(key) < minKeyLen || len(id) == 0 {
				t.Fatalf("line %q: key %x, %v", line, key, ok)
			}
		}
		if k.Len() != n {
			t.Fatalf("%d keys of %d lines", k.Len(), n)
		}
	})
}
