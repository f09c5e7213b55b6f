package donor

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// dialHello sends HELLO on a new connection to addr and returns it with
// the session id the donor answered.
func dialHello(t testing.TB, addr string, kind uint8, session uint64, cred string) (net.Conn, uint64) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := protocol.Hello{Kind: kind, Session: session, Credential: cred}
	p := h.Encode(nil)
	b := make([]byte, protocol.HeaderSize, protocol.HeaderSize+len(p))
	(&protocol.Header{Op: protocol.OpHello, Payload: uint32(len(p))}).Encode(b)
	if _, err := c.Write(append(b, p...)); err != nil {
		t.Fatal(err)
	}
	rep := make([]byte, protocol.HeaderSize+12)
	if _, err := io.ReadFull(c, rep); err != nil {
		t.Fatal(err)
	}
	if st := binary.BigEndian.Uint16(rep[6:]); st != protocol.StatusOK {
		t.Fatalf("hello status %d", st)
	}
	return c, binary.BigEndian.Uint64(rep[protocol.HeaderSize:])
}

// RemoveRegion must not free a region while handlers of a session that
// already ended (its control connection closed) still serve it: they
// would write into unmapped memory (crashing the donor) or into the next
// region mapped there.
func TestRemoveRegionWaitsForEndedSessions(t *testing.T) {
	d := New(nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	addr := ln.Addr().String()
	const batch, size = 32, 1024
	for i := 0; i < 200; i++ {
		cred := fmt.Sprintf("%s-%d", testCred, i)
		if err := d.AddRegion(cred, 4096); err != nil {
			t.Fatal(err)
		}
		ctrl, sess := dialHello(t, addr, protocol.KindControl, 0, cred)
		q, _ := dialHello(t, addr, protocol.KindQueue, sess, cred)
		// Keep the queue busy with writes until the donor hangs up.
		stop := make(chan struct{})
		go func() {
			defer close(stop)
			req := make([]byte, 0, batch*(protocol.HeaderSize+size))
			for j := 0; j < batch; j++ {
				var h [protocol.HeaderSize]byte
				(&protocol.Header{Op: protocol.OpWrite, Seq: uint32(j), Payload: size, Length: size}).Encode(h[:])
				req = append(append(req, h[:]...), make([]byte, size)...)
			}
			rep := make([]byte, batch*protocol.HeaderSize)
			for {
				if _, err := q.Write(req); err != nil {
					return
				}
				if _, err := io.ReadFull(q, rep); err != nil {
					return
				}
			}
		}()
		ctrl.Close()
		deadline := time.Now().Add(10 * time.Second)
		for {
			d.mu.Lock()
			ended := d.regions[credKey(cred)].sess == nil
			d.mu.Unlock()
			if ended {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("session did not end")
			}
		}
		if err := d.RemoveRegion(cred); err != nil {
			t.Fatal(err)
		}
		<-stop
		q.Close()
	}
}
