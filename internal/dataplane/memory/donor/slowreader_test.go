package donor_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"golang.org/x/sys/unix"
)

// TestSlowReaderKeepsItsConnection: a peer that reads its replies
// slowly but steadily (a borrower's bulk reads over a slow link) takes
// some of them every SendWait, though the donor's socket buffer, full,
// does not report room for more (Linux reports it once a third of the
// buffer is free): its connection is not ended, and every reply
// arrives whole. A wait for output that found no room for SendWait
// ended the connection, whatever the peer took meanwhile.
func TestSlowReaderKeepsItsConnection(t *testing.T) {
	const (
		sendWait = 500 * time.Millisecond
		reads    = 8                     // pipelined READs of MaxPayload
		slowFor  = 6 * sendWait          // the slow phase
		chunk    = 16 << 10              // read at a time, slowly
		every    = 16 * time.Millisecond // 1 MB/s
	)
	ca := memorytest.NewCA(t)
	for _, withTLS := range []bool{false, true} {
		for _, k := range []struct {
			kind uint8
			name string
		}{{protocol.KindBulk, "bulk"}, {protocol.KindQueue, "queue"}} {
			t.Run(fmt.Sprintf("%s/tls=%v", k.name, withTLS), func(t *testing.T) {
				t.Parallel() // each mostly sleeps between its reads
				set := func(d *donor.Donor) { d.SendWait = sendWait }
				td, cfg := memorytest.StartWith(t, reads*protocol.MaxPayload, 0, set), (*tls.Config)(nil)
				if withTLS {
					td, cfg = memorytest.StartTLSWith(t, memorytest.ServerTLS(t, ca), reads*protocol.MaxPayload, 0, set), memorytest.ClientTLS(t, ca)
				}
				ctl, sess := dialConn(t, td.Addr, cfg, protocol.KindControl, 0, nil)
				go func() { _, _ = io.Copy(io.Discard, ctl) }() // credit updates; ends with the donor
				// A small receive buffer: what the peer has not read
				// waits in the donor's socket buffer.
				dl := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
					var serr error
					if err := rc.Control(func(fd uintptr) {
						serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10)
					}); err != nil {
						return err
					}
					return serr
				}}
				c, _ := dialConnWith(t, dl, td.Addr, cfg, k.kind, sess, nil)
				conns := td.D.DataConns()
				for i := range reads {
					c.send(t, protocol.Header{Op: protocol.OpRead, Seq: uint32(i + 1), Offset: uint64(i) * protocol.MaxPayload, Length: protocol.MaxPayload}, nil)
				}
				buf := make([]byte, chunk)
				took := 0
				for end := time.Now().Add(slowFor); time.Now().Before(end); {
					_ = c.sock.SetReadDeadline(time.Now().Add(10 * time.Second))
					n, err := io.ReadFull(c, buf)
					took += n
					if err != nil {
						t.Fatalf("after %d bytes, read slowly for %v: %v", took, slowFor, err)
					}
					time.Sleep(every)
				}
				t.Logf("took %d bytes in %v", took, slowFor)
				if n := td.D.DataConns(); n != conns {
					t.Fatalf("%d data connections after the slow reads, want %d: the slow reader's was ended", n, conns)
				}
				// The rest at once: every reply whole.
				rest := reads*(protocol.HeaderSize+protocol.MaxPayload) - took
				_ = c.sock.SetReadDeadline(time.Now().Add(10 * time.Second))
				if n, err := io.CopyN(io.Discard, c, int64(rest)); err != nil {
					t.Fatalf("the replies' last %d bytes: %d, %v", rest, n, err)
				}
			})
		}
	}
}
