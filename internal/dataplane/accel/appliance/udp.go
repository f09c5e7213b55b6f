package appliance

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
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

// bindUDPAt binds queues sockets at addr. The first is bound without
// SO_REUSEPORT, so that the bind fails if any socket holds the port (with
// SO_REUSEPORT the kernel would add ours to another process's group of the
// same user, which would then receive part of the slot's datagrams); it
// gets SO_REUSEPORT once bound and the others join it.
func (s *slot) bindUDPAt(ctx context.Context, addr string, queues int) ([]net.PacketConn, error) {
	control := func(reuse bool) func(_, _ string, c syscall.RawConn) error {
		return func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if reuse {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
				}
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	var conns []net.PacketConn
	fail := func(err error) ([]net.PacketConn, error) {
		for _, c := range conns {
			c.Close()
		}
		return nil, fmt.Errorf("appliance: slot %d udp listen %s: %w", s.id, addr, err)
	}
	first := net.ListenConfig{Control: control(false)}
	pc, err := first.ListenPacket(ctx, "udp4", addr)
	if err != nil {
		return fail(err)
	}
	conns = append(conns, pc)
	addr = pc.LocalAddr().String() // the port, if addr asked for any
	if queues > 1 {
		rc, err := pc.(*net.UDPConn).SyscallConn()
		if err == nil {
			err = control(true)("", "", rc)
		}
		if err != nil {
			return fail(err)
		}
	}
	rest := net.ListenConfig{Control: control(true)}
	for len(conns) < queues {
		pc, err := rest.ListenPacket(ctx, "udp4", addr)
		if err != nil {
			return fail(err)
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
			u.worker(ctx, pc)
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
	in  int // index into the received datagrams
	seq uint32
	ses uint64
}

type reqGroup struct {
	entry string
	reqs  []pendingReq
}

// addToGroup appends r to entry's group (there are few entry points).
func addToGroup(gs []reqGroup, entry string, r pendingReq) []reqGroup {
	for i := range gs {
		if gs[i].entry == entry {
			gs[i].reqs = append(gs[i].reqs, r)
			return gs
		}
	}
	if len(gs) >= 16 { // forget idle groups rather than grow without bound
		gs = slices.DeleteFunc(gs, func(g reqGroup) bool { return len(g.reqs) == 0 })
	}
	return append(gs, reqGroup{entry: entry, reqs: []pendingReq{r}})
}

type inMsg struct {
	d    []byte
	addr net.Addr
}

type outMsg struct {
	off, end int // in the reply arena
	addr     net.Addr
}

func (u *udpSlot) worker(ctx context.Context, pc net.PacketConn) {
	bc := ipv4.NewPacketConn(pc)
	var gro bool
	if sc, ok := pc.(syscall.Conn); ok {
		gro = EnableGRO(sc)
	}
	gso := true
	rx := make([]ipv4.Message, udpBatch)
	for i := range rx {
		rx[i].Buffers = [][]byte{make([]byte, 65536)}
		rx[i].OOB = make([]byte, 64)
	}
	var (
		ins    []inMsg
		outs   []outMsg
		arena  []byte
		tx     []ipv4.Message
		items  [][]byte
		groups []reqGroup // requests by entry point, reused across batches
	)
	reply := func(addr net.Addr, h UDPHeader, p []byte) {
		off := len(arena)
		arena = AppendUDP(arena, h, p)
		outs = append(outs, outMsg{off, len(arena), addr})
	}
	for {
		n, err := bc.ReadBatch(rx, 0)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		ins, outs, arena = ins[:0], outs[:0], arena[:0]
		for g := range groups {
			groups[g].reqs = groups[g].reqs[:0]
		}
		var (
			lastSes  *udpSession
			lastID   uint64
			lastFrom netip.Addr
		)
		for i := range n {
			size := 0
			if gro {
				size = GROSize(rx[i].OOB[:rx[i].NN])
			}
			SplitGRO(rx[i].Buffers[0][:rx[i].N], size, func(d []byte) { ins = append(ins, inMsg{d, rx[i].Addr}) })
		}
		for i, m := range ins {
			h, p, err := DecodeUDP(m.d)
			if err != nil {
				continue // not ours: no answer to a stray datagram
			}
			switch h.Op {
			case UDPHello:
				id, err := u.hello(p, addrOf(m.addr))
				if err != nil {
					reply(m.addr, UDPHeader{Op: UDPError, Seq: h.Seq}, []byte(err.Error()))
					continue
				}
				reply(m.addr, UDPHeader{Op: UDPWelcome, Seq: h.Seq, Session: id}, nil)
			case UDPReq:
				from := addrOf(m.addr)
				ses := lastSes
				if ses == nil || h.Session != lastID || from != lastFrom {
					// A batch is mostly one session's burst: look it up once.
					ses, err = u.session(h.Session, from)
					lastSes, lastID, lastFrom = ses, h.Session, from
				}
				if ses == nil {
					reply(m.addr, UDPHeader{Op: UDPError, Seq: h.Seq, Session: h.Session}, []byte(err.Error()))
					continue
				}
				groups = addToGroup(groups, ses.entry, pendingReq{in: i, seq: h.Seq, ses: h.Session})
			}
		}
		for _, g := range groups {
			entry, reqs := g.entry, g.reqs
			if len(reqs) == 0 {
				continue
			}
			items = items[:0]
			for _, r := range reqs {
				items = append(items, ins[r.in].d[UDPHeaderSize:])
			}
			results, err := u.s.executeCounted(ctx, entry, items)
			for k, r := range reqs {
				addr := ins[r.in].addr
				switch {
				case err != nil:
					reply(addr, UDPHeader{Op: UDPError, Seq: r.seq, Session: r.ses}, []byte(err.Error()))
				case len(results[k]) > MaxUDPPayload:
					reply(addr, UDPHeader{Op: UDPError, Seq: r.seq, Session: r.ses}, []byte("appliance: output does not fit a datagram"))
				default:
					reply(addr, UDPHeader{Op: UDPResp, Seq: r.seq, Session: r.ses}, results[k])
				}
			}
		}
		// Replies to one peer of one size leave as one segmented send.
		tx = tx[:0]
		for i := 0; i < len(outs); {
			j := i + 1
			size := outs[i].end - outs[i].off
			if gso {
				for j < len(outs) && j-i < MaxGSOSegments && outs[j].end-outs[i].off <= 65000 &&
					sameAddr(outs[j].addr, outs[i].addr) && outs[j].end-outs[j].off <= size &&
					outs[j-1].end-outs[j-1].off == size {
					j++
				}
			}
			m := ipv4.Message{Buffers: [][]byte{arena[outs[i].off:outs[j-1].end]}, Addr: outs[i].addr}
			if j-i > 1 {
				m.OOB = SegmentOOB(nil, size)
			}
			tx = append(tx, m)
			i = j
		}
		for sent := 0; sent < len(tx); {
			k, err := bc.WriteBatch(tx[sent:], 0)
			if err != nil {
				if gso && len(tx[sent].OOB) > 0 && !errors.Is(err, net.ErrClosed) {
					// No segmentation offload here: send one by one from now on.
					gso = false
					u.s.a.log.Info("appliance: UDP segmentation offload unavailable", "slot", u.s.id, "err", err)
					tx = splitSegmented(tx[sent:], outs, arena)
					sent = 0
					continue
				}
				break // a full socket buffer or a gone peer: the datagrams are lost, as on a wire
			}
			sent += k
		}
	}
}

// splitSegmented turns segmented sends back into one message per datagram.
func splitSegmented(tx []ipv4.Message, outs []outMsg, arena []byte) []ipv4.Message {
	var res []ipv4.Message
	for _, m := range tx {
		if len(m.OOB) == 0 {
			res = append(res, m)
			continue
		}
		b := m.Buffers[0]
		// The arena offset of b tells which replies it holds.
		start := cap(arena) - cap(b)
		for _, o := range outs {
			if o.off >= start && o.end <= start+len(b) {
				res = append(res, ipv4.Message{Buffers: [][]byte{arena[o.off:o.end]}, Addr: o.addr})
			}
		}
	}
	return res
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
	// The session is bound to the lease its credential was checked
	// against, not to whichever is current a moment later.
	l := u.s.currentLease()
	if err := (*slotTarget)(u.s).authenticate(l, cred); err != nil {
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
	u.sess[id] = &udpSession{entry: entry, from: from, lease: l}
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
