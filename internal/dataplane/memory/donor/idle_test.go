package donor_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/pki"
	"golang.org/x/sys/unix"
)

// pollThreads is the number of the process's threads sleeping in
// ppoll(2) now (what rawconn's poll(2) waits are: unix.Poll is ppoll): the
// threads the donor's raw connections hold while they wait. The Go
// runtime's own waits are in epoll_pwait, futex and nanosleep.
func pollThreads(t *testing.T) int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/syscall")
	if err != nil || len(tasks) == 0 {
		t.Skipf("no /proc/self/task/*/syscall: %v", err)
	}
	want := strconv.Itoa(unix.SYS_PPOLL) + " "
	n := 0
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		if strings.HasPrefix(string(b), want) {
			n++
		}
	}
	return n
}

// conn is a memory-protocol connection of a test, plaintext or TLS,
// counting the bytes it wrote to its socket.
type conn struct {
	net.Conn          // the protocol's (TLS inside, or the socket)
	sock     net.Conn // the socket
	wrote    atomic.Int64
}

type countingConn struct {
	net.Conn
	c *conn
}

func (cc countingConn) Write(b []byte) (int, error) {
	n, err := cc.Conn.Write(b)
	cc.c.wrote.Add(int64(n))
	return n, err
}

// dialConn connects to addr (with TLS if cfg is set) and sends HELLO of
// kind in session (0: a control connection's); before runs first, with
// the socket. It returns the HELLO reply's session id.
func dialConn(t *testing.T, addr string, cfg *tls.Config, kind uint8, session uint64, before func(net.Conn)) (*conn, uint64) {
	t.Helper()
	return dialConnWith(t, &net.Dialer{}, addr, cfg, kind, session, before)
}

// dialConnWith is dialConn through dl.
func dialConnWith(t *testing.T, dl *net.Dialer, addr string, cfg *tls.Config, kind uint8, session uint64, before func(net.Conn)) (*conn, uint64) {
	t.Helper()
	nc, err := dl.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if before != nil {
		before(nc)
	}
	c := &conn{sock: nc}
	c.Conn = countingConn{Conn: nc, c: c}
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.ServerName = "127.0.0.1"
		c.Conn = tls.Client(c.Conn, cfg)
	}
	return c, donor.SendHello(t, c, protocol.Hello{Kind: kind, Session: session, Credential: testCred})
}

// send sends h with payload on c.
func (c *conn) send(t *testing.T, h protocol.Header, payload []byte) {
	t.Helper()
	donor.SendFrame(t, c, h, payload)
}

// reply reads the reply to request seq of op on c and returns its data.
func (c *conn) reply(t *testing.T, seq uint32, op uint8) []byte {
	t.Helper()
	_ = c.sock.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.sock.SetReadDeadline(time.Time{})
	var hdr [protocol.HeaderSize]byte
	fr, err := protocol.ReadFrame(c, hdr[:], nil)
	if err != nil {
		t.Fatalf("reply to request %d: %v", seq, err)
	}
	if fr.Status != protocol.StatusOK || fr.Seq != seq || fr.Op != op || !fr.IsResponse() {
		t.Fatalf("reply seq %d op %d status %d (%s) to request %d op %d", fr.Seq, fr.Op, fr.Status, fr.Data, seq, op)
	}
	return fr.Data
}

// ping has c answer a PING (seq).
func (c *conn) ping(t *testing.T, seq uint32) {
	t.Helper()
	c.send(t, protocol.Header{Op: protocol.OpPing, Seq: seq}, nil)
	c.reply(t, seq, protocol.OpPing)
}

// peerPort is the port of the peer of a donor's descriptor fd.
func peerPort(fd int) int {
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return -1
	}
	if a, ok := sa.(*unix.SockaddrInet4); ok {
		return a.Port
	}
	return -1
}

// move is a raw connection's move to the netpoller (parked) or back,
// held until release closes.
type move struct {
	fd      int
	parked  bool
	release chan struct{}
}

// watch reports the moves of one of a donor's raw connections (the one
// whose peer's port is port: dial's sync connection) on moves, each held
// until the test releases it (or ends); the others go on.
type watch struct {
	port  atomic.Int32
	moves chan move
}

// watchMoves has d report the moves of the connection the watch returned
// dials.
func watchMoves(t *testing.T, d *donor.Donor) *watch {
	w := &watch{moves: make(chan move)}
	done := t.Context().Done() // before the donor stops (its cleanup)
	d.SetMoved(func(fd int, parked bool) {
		if int32(peerPort(fd)) != w.port.Load() {
			return
		}
		m := move{fd: fd, parked: parked, release: make(chan struct{})}
		select {
		case w.moves <- m:
		case <-done:
			return
		}
		select {
		case <-m.release:
		case <-done:
		}
	})
	return w
}

// dial opens a session on the donor at addr (with TLS when cfg is set):
// its control connection, and a sync connection, the one watched.
func (w *watch) dial(t *testing.T, addr string, cfg *tls.Config) (ctl, c *conn) {
	t.Helper()
	ctl, sess := dialConn(t, addr, cfg, protocol.KindControl, 0, nil)
	c, _ = dialConn(t, addr, cfg, protocol.KindSync, sess, func(nc net.Conn) {
		w.port.Store(int32(nc.LocalAddr().(*net.TCPAddr).Port))
	})
	return ctl, c
}

// next waits for the next move reported and checks which way it goes.
func (w *watch) next(t *testing.T, parked bool) move {
	t.Helper()
	select {
	case m := <-w.moves:
		if m.parked != parked {
			t.Fatalf("a move parked=%v, want parked=%v", m.parked, parked)
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("no move parked=%v", parked)
	}
	return move{}
}

// arrived waits until the donor's socket fd has n bytes at least to read:
// the bytes a test sent are there before the donor goes on.
func arrived(t *testing.T, fd int, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		q, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		if int64(q) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes at the donor's socket, want %d", q, n)
		}
	}
}

// startIdle serves a donor whose connections move to the netpoller as soon
// as a wait finds no request (IdleWait 1), set (nil: none) setting its
// other fields. With withTLS it requires TLS with a certificate from ca,
// and the configuration returned is its client's; without, it is
// plaintext and the configuration nil.
func startIdle(t *testing.T, ca *pki.CA, withTLS bool, set func(*donor.Donor)) (*memorytest.Donor, *tls.Config) {
	t.Helper()
	idle := func(d *donor.Donor) {
		d.IdleWait = 1
		if set != nil {
			set(d)
		}
	}
	if !withTLS {
		return memorytest.StartWith(t, 1<<20, 0, idle), nil
	}
	return memorytest.StartTLSWith(t, memorytest.ServerTLS(t, ca), 1<<20, 0, idle), memorytest.ClientTLS(t, ca)
}

// startWatched is startIdle with its moves watched (watchMoves).
func startWatched(t *testing.T, ca *pki.CA, withTLS bool) (*memorytest.Donor, *tls.Config, *watch) {
	t.Helper()
	var w *watch
	td, cfg := startIdle(t, ca, withTLS, func(d *donor.Donor) { w = watchMoves(t, d) })
	return td, cfg, w
}

// signalMoves has d signal each move of its raw connections to the
// netpoller and back on the returned channel, which holds one signal
// (more are dropped while it is full): a look at the connections parked
// is due.
func signalMoves(d *donor.Donor) <-chan struct{} {
	moved := make(chan struct{}, 1)
	d.SetMoved(func(int, bool) {
		select {
		case moved <- struct{}{}:
		default:
		}
	})
	return moved
}

// awaitParked waits until want of td's connections are parked on the
// netpoller, looking again at each signal on moved (signalMoves).
func awaitParked(t *testing.T, td *memorytest.Donor, moved <-chan struct{}, want int) {
	t.Helper()
	for {
		if parked, _ := td.D.ParkedConns(); parked == want {
			return
		}
		select {
		case <-moved:
		case <-time.After(10 * time.Second):
			parked, polling := td.D.ParkedConns()
			t.Fatalf("%d of %d connections parked (%d threads held)", parked, want, polling)
		}
	}
}

// TestIdleConnectionsHoldNoThreads: data connections that wait for their
// next request hold none of the donor's threads once idle for IdleWait:
// their goroutines wait on the netpoller. Each held a thread sleeping in
// poll(2) (as with IdleWait negative), and the Go runtime ends the
// process past 10000 threads: the donor bounded its connections by its
// threads, and a tenant's idle connections pinned thousands of them.
func TestIdleConnectionsHoldNoThreads(t *testing.T) {
	const n = 48 // sync, bulk and fault connections
	kinds := []uint8{protocol.KindSync, protocol.KindBulk, protocol.KindFault}
	for _, tc := range []struct {
		name string
		idle time.Duration
	}{{"IdleWait negative: held, as before", -1}, {"IdleWait 1ms", time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			var moved <-chan struct{}
			td := memorytest.StartWith(t, 1<<20, 0, func(d *donor.Donor) {
				d.IdleWait = tc.idle
				moved = signalMoves(d)
			})
			_, sess := dialConn(t, td.Addr, nil, protocol.KindControl, 0, nil)
			before := pollThreads(t)
			var cs []*conn
			for i := range n {
				c, _ := dialConn(t, td.Addr, nil, kinds[i%len(kinds)], sess, nil)
				c.ping(t, 1)
				cs = append(cs, c)
			}
			if tc.idle < 0 {
				// Each connection's thread goes back to poll(2) after
				// its PING's answer: all of them, soon.
				got := 0
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
					if got = pollThreads(t) - before; got >= n {
						break
					}
				}
				if got < n {
					t.Fatalf("%d idle connections hold %d threads in poll(2), want %d", n, got, n)
				}
				t.Logf("%d idle connections hold %d threads in poll(2)", n, got)
				return
			}
			awaitParked(t, td, moved, n)
			if _, polling := td.D.ParkedConns(); polling != 0 {
				t.Fatalf("%d threads held for poll(2) with every connection parked", polling)
			}
			if got := pollThreads(t) - before; got >= n/8 {
				t.Fatalf("%d idle connections hold %d threads in poll(2), want none", n, got)
			}
			// They serve on, woken by their next request.
			for _, c := range cs {
				c.ping(t, 2)
			}
		})
	}
}

// TestRequestsAroundIdleSwitch: requests that arrive exactly as a
// connection moves to the netpoller (after its wait in poll(2) found
// none for IdleWait, before it registers: the netpoller must see them
// there already) or back (woken, before it leaves the netpoller), or
// while it waits there, are all served, in order, plaintext and over
// TLS: a WRITE, then a READ of its range sent behind it.
func TestRequestsAroundIdleSwitch(t *testing.T) {
	ca := memorytest.NewCA(t)
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			td, cfg, w := startWatched(t, ca, withTLS)
			_, c := w.dial(t, td.Addr, cfg)
			seq := uint32(0)
			for k := range 60 {
				m := w.next(t, true)
				// Nothing is left to read at the donor: its wait found
				// no request.
				start := c.wrote.Load()
				payload := bytes.Repeat([]byte{byte(k + 1)}, 256)
				off := uint64(k%16) * 4096
				seq++
				wseq := seq
				switch k % 3 {
				case 0: // before it registers with the netpoller
					c.send(t, protocol.Header{Op: protocol.OpWrite, Seq: wseq, Offset: off, Length: uint32(len(payload))}, payload)
					arrived(t, m.fd, c.wrote.Load()-start)
					close(m.release)
				case 1: // while it waits there (or registers)
					close(m.release)
					c.send(t, protocol.Header{Op: protocol.OpWrite, Seq: wseq, Offset: off, Length: uint32(len(payload))}, payload)
				case 2: // a PING first, as it registers, then the WRITE
					seq++
					c.send(t, protocol.Header{Op: protocol.OpPing, Seq: wseq}, nil)
					close(m.release)
					c.send(t, protocol.Header{Op: protocol.OpWrite, Seq: seq, Offset: off, Length: uint32(len(payload))}, payload)
				}
				back := w.next(t, false)
				// Woken by the request: another behind it, as it
				// leaves the netpoller.
				seq++
				rseq := seq
				c.send(t, protocol.Header{Op: protocol.OpRead, Seq: rseq, Offset: off, Length: uint32(len(payload))}, nil)
				arrived(t, back.fd, c.wrote.Load()-start)
				close(back.release)
				if k%3 == 2 {
					c.reply(t, wseq, protocol.OpPing)
					wseq++
				}
				c.reply(t, wseq, protocol.OpWrite)
				if got := c.reply(t, rseq, protocol.OpRead); !bytes.Equal(got, payload) {
					t.Fatalf("round %d: the READ behind the WRITE got %x..., want %x...", k, got[:8], payload[:8])
				}
			}
		})
	}
}

// TestIdleConnectionLeavesNetpoller: a connection that moved to the
// netpoller while idle is off it again once a request woke it (its
// registration, under a descriptor of its own, closed before the request
// is read), as TestRawDescriptorsOffNetpoller wants of a connection in
// use: every segment of a registered socket wakes the netpoller's thread.
func TestIdleConnectionLeavesNetpoller(t *testing.T) {
	td, _, w := startWatched(t, nil, false)
	_, c := w.dial(t, td.Addr, nil)
	m := w.next(t, true)
	named := map[int]string{m.fd: "an idle connection"}
	if regs := memorytest.Registrations(t, named); len(regs) != 0 {
		t.Fatalf("registered before it moved: %v", regs)
	}
	close(m.release)
	c.send(t, protocol.Header{Op: protocol.OpPing, Seq: 1}, nil)
	m = w.next(t, false)
	if regs := memorytest.Registrations(t, named); len(regs) != 1 {
		t.Fatalf("an idle connection woken on the netpoller has %d registrations, want 1: %v", len(regs), regs)
	}
	close(m.release)
	c.reply(t, 1, protocol.OpPing)
	m = w.next(t, true) // its next wait, after the answer
	memorytest.CheckOffNetpoller(t, named)
	close(m.release)
}

// TestPollThreadsBound: past MaxPollThreads connections in use at once,
// the others wait for their requests on the netpoller, and all serve:
// however many connections are busy, the threads they sleep in poll(2)
// on stay within the bound.
func TestPollThreadsBound(t *testing.T) {
	const n, limit = 6, 2
	td := memorytest.StartWith(t, 1<<20, 0, func(d *donor.Donor) {
		d.IdleWait = time.Hour // none moves for being idle
		d.MaxPollThreads = limit
	})
	_, sess := dialConn(t, td.Addr, nil, protocol.KindControl, 0, nil)
	kinds := []uint8{protocol.KindSync, protocol.KindBulk, protocol.KindFault}
	var cs []*conn
	for i := range n {
		c, _ := dialConn(t, td.Addr, nil, kinds[i%len(kinds)], sess, nil)
		c.ping(t, 1) // served: the first two hold a thread each
		cs = append(cs, c)
	}
	if parked, polling := td.D.ParkedConns(); parked != n-limit || polling != limit {
		t.Fatalf("%d connections parked, %d threads held; want %d and %d", parked, polling, n-limit, limit)
	}
	seq := uint32(1)
	for round := range 20 {
		seq += 2
		for i, c := range cs {
			payload := bytes.Repeat([]byte{byte(round), byte(i)}, 512)
			off := uint64(i) * 4096
			c.send(t, protocol.Header{Op: protocol.OpWrite, Seq: seq, Offset: off, Length: uint32(len(payload))}, payload)
			c.send(t, protocol.Header{Op: protocol.OpRead, Seq: seq + 1, Offset: off, Length: uint32(len(payload))}, nil)
		}
		for i, c := range cs {
			c.reply(t, seq, protocol.OpWrite)
			if got := c.reply(t, seq+1, protocol.OpRead); !bytes.Equal(got[:2], []byte{byte(round), byte(i)}) {
				t.Fatalf("connection %d read %x", i, got[:2])
			}
		}
		if _, polling := td.D.ParkedConns(); polling > limit {
			t.Fatalf("%d threads held for poll(2), bound %d", polling, limit)
		}
	}
}

// TestTeardownWakesParkedConnections: the end of a session, and the
// removal of its region (which waits for every connection's handler
// before it wipes and unmaps the memory), wake the connections waiting
// on the netpoller, plaintext and over TLS: their handlers return, and
// the removal does.
func TestTeardownWakesParkedConnections(t *testing.T) {
	ca := memorytest.NewCA(t)
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			const n = 6
			var moved <-chan struct{}
			td, cfg := startIdle(t, ca, withTLS, func(d *donor.Donor) { moved = signalMoves(d) })
			want := n
			if withTLS {
				want++ // the control connection is a raw one too
			}
			_, sess := dialConn(t, td.Addr, cfg, protocol.KindControl, 0, nil)
			var cs []*conn
			for range n {
				c, _ := dialConn(t, td.Addr, cfg, protocol.KindSync, sess, nil)
				c.ping(t, 1)
				cs = append(cs, c)
			}
			awaitParked(t, td, moved, want)
			if err := td.D.RemoveRegion(testCred); err != nil {
				t.Fatal(err)
			}
			if parked, polling := td.D.ParkedConns(); parked != 0 || polling != 0 {
				t.Fatalf("after the removal: %d connections parked, %d threads held", parked, polling)
			}
			for i, c := range cs {
				_ = c.sock.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.ReadAll(c); err != nil && !isReset(err) {
					t.Fatalf("connection %d after the removal: %v", i, err)
				}
			}
		})
	}
}

// isReset: the donor closed the connection under unread bytes (a TLS
// close_notify is not sent), or TLS saw the end of the stream.
func isReset(err error) bool {
	return strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "EOF")
}
