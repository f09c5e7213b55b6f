package tlspsk

import (
	"errors"
	"io"
	"testing"
	"time"
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
