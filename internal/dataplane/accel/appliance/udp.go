package appliance

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// udpBatch is how many datagrams one recvmmsg or sendmmsg moves at most.
const udpBatch = 64

// maxUDPSessions bounds a slot's sessions; the oldest goes first.
const maxUDPSessions = 4096

// udpSession is one borrower's HELLO: the entry its requests run and the
// address they must come from, valid while its lease is current.
type udpSession struct {
	entry string
	from  netip.Addr
	lease *lease
}

type udpSlot struct {
	s     *slot
	mu    sync.Mutex
	sess  map[uint64]*udpSession
	order []uint64
}

// bindUDP binds the slot's UDP message path on the slot's address (its
// TCP listener's host and port): queues sockets bound with SO_REUSEPORT,
// so that the kernel spreads flows over them.
func (s *slot) bindUDP(ctx context.Context, queues int) ([]net.PacketConn, error) {
	return s.bindUDPAt(ctx, s.ln.Addr().String(), queues)
}

func (s *slot) udpConns() []net.PacketConn {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	return s.udp
}

func (s *slot) bindUDPAt(ctx context.Context, addr string, queues int) ([]net.PacketConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			if serr == nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	var conns []net.PacketConn
	for range queues {
		pc, err := lc.ListenPacket(ctx, "udp4", addr)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("appliance: slot %d udp listen %s: %w", s.id, addr, err)
		}
		conns = append(conns, pc)
	}
	return conns, nil
}

// serveUDP serves the slot's UDP sockets, each read and written in batches
// (recvmmsg, sendmmsg) by a worker of its own, until ctx ends.
func (s *slot) serveUDP(ctx context.Context, conns []net.PacketConn) {
	u := &udpSlot{s: s, sess: map[uint64]*udpSession{}}
	stop := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	defer stop()
	var wg sync.WaitGroup
	for _, pc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u.worker(ctx, ipv4.NewPacketConn(pc))
		}()
	}
	wg.Wait()
}

// UDPAddr returns slot id's UDP message address (the same host and port as
// its mailbox), or "" if the appliance does not serve UDP.
func (a *Appliance) UDPAddr(id int) (string, error) {
	if a.cfg.UDPQueues <= 0 {
		return "", nil
	}
	return a.Addr(id)
}

type pendingReq struct {
	msg int // index into the received batch
	seq uint32
	ses uint64
}

func (u *udpSlot) worker(ctx context.Context, pc *ipv4.PacketConn) {
	rx := make([]ipv4.Message, udpBatch)
	for i := range rx {
		rx[i].Buffers = [][]byte{make([]byte, 65536)}
	}
	tx := make([]ipv4.Message, 0, udpBatch)
	out := make([][]byte, udpBatch)
	byEntry := map[string][]pendingReq{}
	var items [][]byte
	for {
		n, err := pc.ReadBatch(rx, 0)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		tx = tx[:0]
		clear(byEntry)
		reply := func(i int, h UDPHeader, p []byte) {
			out[len(tx)] = AppendUDP(out[len(tx)][:0], h, p)
			tx = append(tx, ipv4.Message{Buffers: [][]byte{out[len(tx)]}, Addr: rx[i].Addr})
		}
		for i := range n {
			d := rx[i].Buffers[0][:rx[i].N]
			h, p, err := DecodeUDP(d)
			if err != nil {
				continue // not ours: no answer to a stray datagram
			}
			from := addrOf(rx[i].Addr)
			switch h.Op {
			case UDPHello:
				id, err := u.hello(p, from)
				if err != nil {
					reply(i, UDPHeader{Op: UDPError, Seq: h.Seq}, []byte(err.Error()))
					continue
				}
				reply(i, UDPHeader{Op: UDPWelcome, Seq: h.Seq, Session: id}, nil)
			case UDPReq:
				ses, err := u.session(h.Session, from)
				if err != nil {
					reply(i, UDPHeader{Op: UDPError, Seq: h.Seq, Session: h.Session}, []byte(err.Error()))
					continue
				}
				byEntry[ses.entry] = append(byEntry[ses.entry], pendingReq{msg: i, seq: h.Seq, ses: h.Session})
			}
		}
		for entry, reqs := range byEntry {
			items = items[:0]
			for _, r := range reqs {
				_, p, _ := DecodeUDP(rx[r.msg].Buffers[0][:rx[r.msg].N])
				items = append(items, p)
			}
			outs, err := u.s.executeCounted(ctx, entry, items)
			for k, r := range reqs {
				switch {
				case err != nil:
					reply(r.msg, UDPHeader{Op: UDPError, Seq: r.seq, Session: r.ses}, []byte(err.Error()))
				case len(outs[k]) > MaxUDPPayload:
					reply(r.msg, UDPHeader{Op: UDPError, Seq: r.seq, Session: r.ses}, []byte("appliance: output does not fit a datagram"))
				default:
					reply(r.msg, UDPHeader{Op: UDPResp, Seq: r.seq, Session: r.ses}, outs[k])
				}
			}
		}
		for sent := 0; sent < len(tx); {
			k, err := pc.WriteBatch(tx[sent:], 0)
			if err != nil {
				break // a full socket buffer or a gone peer: the datagrams are lost, as on a wire
			}
			sent += k
		}
	}
}

// executeCounted runs a batch as the TCP path's Execute does, with the
// slot's counters.
func (s *slot) executeCounted(ctx context.Context, entry string, ins [][]byte) ([][]byte, error) {
	return (*slotTarget)(s).Execute(ctx, entry, ins)
}

func addrOf(a net.Addr) netip.Addr {
	if ua, ok := a.(*net.UDPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ua.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// hello authenticates a HELLO and opens a session bound to the sender's
// address and the current lease.
func (u *udpSlot) hello(p []byte, from netip.Addr) (uint64, error) {
	entry, cred, err := DecodeHelloPayload(p)
	if err != nil {
		return 0, err
	}
	t := (*slotTarget)(u.s)
	if err := t.Authenticate(cred); err != nil {
		return 0, err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := binary.BigEndian.Uint64(b[:]) | 1
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.order) >= maxUDPSessions {
		delete(u.sess, u.order[0])
		u.order = u.order[1:]
	}
	u.sess[id] = &udpSession{entry: entry, from: from, lease: u.s.currentLease()}
	u.order = append(u.order, id)
	return id, nil
}

// session returns a request's session if it is known, comes from its
// address and its lease is still current.
func (u *udpSlot) session(id uint64, from netip.Addr) (*udpSession, error) {
	u.mu.Lock()
	ses := u.sess[id]
	u.mu.Unlock()
	if ses == nil || ses.from != from {
		return nil, errors.New("appliance: unknown session (send HELLO)")
	}
	if ses.lease != u.s.currentLease() {
		u.mu.Lock()
		delete(u.sess, id)
		u.mu.Unlock()
		return nil, errors.New("appliance: the session's lease has ended")
	}
	return ses, nil
}
