package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// answeringPeer is a TCP peer speaking the server side of NBD (fixed
// newstyle, NBD_OPT_GO, simple replies) that answers the second request it
// reads, a large write, as soon as it has its header, without reading its
// payload; then it answers the first, a read, and, when told, hangs up
// with the write's payload unread (a reset), so that the client's send of
// that payload fails after its reply has been read.
type answeringPeer struct {
	ln       net.Listener
	first    chan struct{} // the first request's header has been read
	hangUp   chan struct{} // closed by the test: reset the connection
	finished chan error
}

const answeringPeerSize = 64 << 20

func startAnsweringPeer(t *testing.T) *answeringPeer {
	t.Helper()
	// A small receive buffer on the accepted socket (inherited from the
	// listener): the write's payload cannot all sit in buffers, so its
	// send is still under way when the peer hangs up.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &answeringPeer{ln: ln, first: make(chan struct{}), hangUp: make(chan struct{}), finished: make(chan error, 1)}
	go func() { p.finished <- p.serve() }()
	t.Cleanup(func() {
		ln.Close()
		select {
		case <-p.hangUp:
		default:
			close(p.hangUp)
		}
		if err := <-p.finished; err != nil {
			t.Errorf("peer: %v", err)
		}
	})
	return p
}

func (p *answeringPeer) serve() error {
	nc, err := p.ln.Accept()
	if err != nil {
		return err
	}
	defer nc.Close()
	r := bufio.NewReader(nc)
	hello := binary.BigEndian.AppendUint64(nil, nbdMagic)
	hello = binary.BigEndian.AppendUint64(hello, optMagic)
	hello = binary.BigEndian.AppendUint16(hello, flagFixedNewstyle|flagNoZeroes)
	if _, err := nc.Write(hello); err != nil {
		return err
	}
	var b [requestHeaderLen]byte
	if _, err := io.ReadFull(r, b[:4]); err != nil { // client flags
		return err
	}
	if _, err := io.ReadFull(r, b[:16]); err != nil {
		return err
	}
	if opt := binary.BigEndian.Uint32(b[8:]); opt != optGo {
		return fmt.Errorf("option %d, want NBD_OPT_GO", opt)
	}
	if _, err := r.Discard(int(binary.BigEndian.Uint32(b[12:]))); err != nil {
		return err
	}
	optReply := func(typ uint32, data []byte) []byte {
		out := binary.BigEndian.AppendUint64(nil, optReplyMagic)
		out = binary.BigEndian.AppendUint32(out, optGo)
		out = binary.BigEndian.AppendUint32(out, typ)
		out = binary.BigEndian.AppendUint32(out, uint32(len(data)))
		return append(out, data...)
	}
	info := binary.BigEndian.AppendUint16(nil, infoExport)
	info = binary.BigEndian.AppendUint64(info, answeringPeerSize)
	info = binary.BigEndian.AppendUint16(info, FlagHasFlags|FlagSendFlush)
	if _, err := nc.Write(append(optReply(repInfo, info), optReply(repAck, nil)...)); err != nil {
		return err
	}

	// Transmission: the read, then the write's header.
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	read, err := parseRequest(b[:])
	if err != nil || read.Type != CmdRead {
		return fmt.Errorf("first request %+v (%v), want a read", read, err)
	}
	close(p.first)
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	write, err := parseRequest(b[:])
	if err != nil || write.Type != CmdWrite {
		return fmt.Errorf("second request %+v (%v), want a write", write, err)
	}
	// Answer the write (its payload unread), then the read: the client's
	// reader completes the write before the read.
	out := make([]byte, 2*simpleReplyLen+int(read.Length))
	putSimpleReply(out, 0, write.Handle)
	putSimpleReply(out[simpleReplyLen:], 0, read.Handle)
	if _, err := nc.Write(out); err != nil {
		return err
	}
	<-p.hangUp
	// Reset, the write's payload unread: the client's send fails.
	nc.(*net.TCPConn).SetLinger(0)
	return nil
}

// TestSendFailsAfterReply: a request whose send fails after its reply has
// been read (the server answered before the rest of the writev reached it,
// then the connection broke) ends with the server's answer, without a
// panic, and the connection is failed: the next request fails with
// ErrClosed. startDone returned a nil call with a nil error there, and
// awaiting it dereferenced nil (a move's copy whose connection was cut
// crashed its agent).
func TestSendFailsAfterReply(t *testing.T) {
	p := startAnsweringPeer(t)
	c := dial(t, p.ln.Addr().String(), "x", WithoutStructuredReplies())
	// Not recovered: the nil dereference panicked holding c.mu, and the
	// test could not go on; a panic fails the test binary.
	writeDone := writeAnsweredBeforeSent(t, p, c)
	close(p.hangUp)
	if err := <-writeDone; err != nil {
		t.Fatalf("the write answered before its send failed: %v, want the server's answer (success)", err)
	}
	err := c.FlushContext(context.Background())
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("a request after the failed send: %v, want ErrClosed", err)
	}
}

// writeAnsweredBeforeSent has c read, then write DefaultMaxBlock bytes
// through the answering peer p, and returns once the read is answered:
// the write has then been answered too, and its payload is still being
// sent (more than the socket buffers hold, and p reads none of it). The
// write's outcome goes to the channel returned.
func writeAnsweredBeforeSent(t *testing.T, p *answeringPeer, c *Client) <-chan error {
	t.Helper()
	// A read awaited with a cancellable context: the background reader
	// reads, so the write's reply is read while its send is under way.
	readDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.ReadAtContext(ctx, make([]byte, 512), 0)
		readDone <- err
	}()
	select {
	case <-p.first:
	case err := <-p.finished:
		p.finished <- err // for the cleanup
		t.Fatalf("peer ended before the read: %v", err)
	}

	// The read's sender must be done writing before the write is sent:
	// a request queued while another caller writes leaves in that
	// caller's writev, and the read's caller would then carry the write's
	// payload (which the peer does not read until told to hang up) and
	// never return.
	awaitWriterIdle(t, c)
	writeDone := make(chan error, 1)
	go func() {
		_, err := c.WriteAtContext(context.Background(), make([]byte, DefaultMaxBlock), 0, false)
		writeDone <- err
	}()

	// The read's reply follows the write's: once the read is answered,
	// the write has been completed by the reader.
	if err := <-readDone; err != nil {
		t.Fatalf("read: %v", err)
	}
	return writeDone
}

// awaitWriterIdle waits until no caller of c is writing requests (the
// read's header has reached the peer, but its sender may not yet have
// seen that nothing more is queued).
func awaitWriterIdle(t *testing.T, c *Client) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.wmu.Lock()
		busy := c.flushing
		c.wmu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the read's sender is still writing after 10s")
		}
		runtime.Gosched()
	}
}

// TestStalledSendAfterReplyTimesOut: a send the server stops reading after
// it answered every request (so none is pending) is bounded by the
// request timeout as a pending request is: the connection fails with
// ErrTimeout, the sender returns the server's answer, and the next
// request fails. The watchdog looked only at pending requests, so the
// sender stayed in its writev, whatever its context said, until another
// request came and timed out.
func TestStalledSendAfterReplyTimesOut(t *testing.T) {
	p := startAnsweringPeer(t)
	c := dial(t, p.ln.Addr().String(), "x", WithoutStructuredReplies(), WithRequestTimeout(300*time.Millisecond))
	writeDone := writeAnsweredBeforeSent(t, p, c)
	// The peer never reads the write's payload (it hangs up only at the
	// test's end): the write's send stalls with nothing pending.
	select {
	case err := <-writeDone:
		if err != nil {
			t.Fatalf("write: %v, want the server's answer (success)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled send still blocks the write 20s past a 300ms request timeout")
	}
	if err := c.FlushContext(context.Background()); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a request after the stalled send: %v, want ErrTimeout", err)
	}
}
