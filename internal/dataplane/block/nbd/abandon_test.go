package nbd

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// firstWriteHeld holds the first write until release is closed and
// records the offsets of the writes that reach it.
type firstWriteHeld struct {
	*MemBackend
	entered, release chan struct{}
	mu               sync.Mutex
	offs             []int64
}

func (b *firstWriteHeld) WriteAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	first := len(b.offs) == 0
	b.offs = append(b.offs, off)
	b.mu.Unlock()
	if first {
		close(b.entered)
		<-b.release
	}
	return b.MemBackend.WriteAt(p, off)
}

func (b *firstWriteHeld) written() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.offs...)
}

// TestAbandonedQueuedWritesDropped: a client sends writes and goes away
// without NBD_CMD_DISC (its connection broke) while the first is being
// executed and the others wait for a worker. The writes still queued must
// not reach the backend afterwards: the client (a composed volume's part,
// `rialto attach`) may have sent them again on a new connection and
// written the range since, and a stale copy landing late would undo that.
// The write being executed completes. With a disconnect, every queued
// request is served.
func TestAbandonedQueuedWritesDropped(t *testing.T) {
	for _, disc := range []bool{false, true} {
		name := "broken"
		if disc {
			name = "disconnect"
		}
		t.Run(name, func(t *testing.T) {
			b := &firstWriteHeld{MemBackend: NewMemBackend(1 << 20), entered: make(chan struct{}), release: make(chan struct{})}
			abandoned := make(chan struct{})
			s := &Server{Workers: 1, testHookAbandoned: func() { close(abandoned) }}
			if err := s.AddExport(Export{Name: testName, Backend: b}); err != nil {
				t.Fatal(err)
			}
			rc := rawDial(t, serveOn(t, s), clientFlagFixedNewstyle|clientFlagNoZeroes)
			rc.goTransmission(testName, false, false)
			stale := bytes.Repeat([]byte{0xee}, 4096)
			// One write executing, one queued for the only worker (the
			// queue holds one: a third would hold the reader until a
			// worker is free). Both in one segment, so that the reader
			// sees the second buffered behind the first and hands the
			// first to the worker rather than executing it itself (and
			// stopping, held, before it reads the client's end).
			var both []byte
			for i := range 2 {
				h := make([]byte, requestHeaderLen)
				putRequest(h, Request{Type: CmdWrite, Handle: uint64(i), Offset: uint64(i) * 4096, Length: 4096})
				both = append(append(both, h...), stale...)
			}
			rc.write(both)
			<-b.entered
			if disc {
				rc.request(Request{Type: CmdDisc}, nil)
				rc.c.(*net.TCPConn).CloseWrite()
				close(b.release)
				for range 2 {
					r, err := rc.reply(0)
					if err != nil || r.errno != 0 {
						t.Fatalf("write %d after a disconnect: errno %d, %v", r.handle, r.errno, err)
					}
				}
				if got := b.written(); len(got) != 2 {
					t.Fatalf("writes that reached the backend: %v, want both", got)
				}
				return
			}
			rc.c.(*net.TCPConn).SetLinger(0)
			rc.c.Close()
			<-abandoned
			close(b.release)
			waitFor(t, "the connection to end", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return len(s.exports[testName].conns) == 0
			})
			if got := b.written(); len(got) != 1 || got[0] != 0 {
				t.Fatalf("writes that reached the backend after the client went away: %v, want only the one executing (0)", got)
			}
		})
	}
}
