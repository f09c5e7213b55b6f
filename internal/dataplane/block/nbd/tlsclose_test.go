package nbd

import (
	"errors"
	"io"
	"testing"
)

// TestTLSDisconnectKeepsReplies: a client over TLS sends reads and
// NBD_CMD_DISC, then ends its side with close_notify and a FIN (as libnbd
// does after NBD_CMD_DISC) and reads the replies it is owed, slowly (a
// small receive buffer). The server stops reading at the disconnect; a
// socket closed with bytes unread (the close_notify) resets the
// connection and drops what it still holds to send. Every reply must
// arrive whole, then the end of the session.
//
// The same holds with a pre-shared key (pskConn), which this package has
// no client for.
func TestTLSDisconnectKeepsReplies(t *testing.T) {
	const n, size = 4, 4 << 20
	disc := make(chan *conn, 1)
	proceed := make(chan struct{})
	s := &Server{testHookDisc: func(c *conn) { disc <- c; <-proceed }}
	if err := s.AddExport(Export{Name: testName, Backend: NewMemBackend(n * size)}); err != nil {
		t.Fatal(err)
	}
	rc := dialAbandon(t, s, "tls", 64<<10)
	var seg []byte
	for i := range n {
		seg = readReq(seg, uint64(i), uint64(i)*size, size)
	}
	rc.write(plainReq(seg, Request{Type: CmdDisc}))
	// The close_notify arrives after the reader has read the disconnect:
	// it stays unread.
	c := <-disc
	endClient(rc, "disconnect")
	waitPeerEnd(t, c)
	close(proceed)
	got := map[uint64]bool{}
	for i := range n {
		r, err := rc.reply(size)
		if err != nil || r.errno != 0 || r.handle >= n || got[r.handle] {
			t.Fatalf("reply %d: handle %d, errno %d, %v", i, r.handle, r.errno, err)
		}
		got[r.handle] = true
	}
	if _, err := rc.r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the replies: %v, want the end of the session", err)
	}
}
