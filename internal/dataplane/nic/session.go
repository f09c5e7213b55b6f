package nic

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// MaxReorder bounds the packets a receiver holds while it waits for an
// earlier one (packets striped over several connections of a session).
const MaxReorder = 8192

// Stats are a tunnel end's counters. All are cumulative.
type Stats struct {
	TxPackets, TxBytes uint64 // sent into the tunnel
	RxPackets, RxBytes uint64 // delivered from the tunnel
	CreditDrops        uint64 // dropped: the peer's credit window was full
	NoPathDrops        uint64 // dropped: no connection or lender up for it
	FilterDrops        uint64 // dropped: not IPv4, or a source address not the lease's
	Reordered          uint64 // arrived ahead of an earlier packet and were held
	// ExpiredDrops (lender): dropped, either way, because the lease's
	// known expiry had passed (Lender.SetLeaseDeadline).
	ExpiredDrops uint64
}

type counters struct {
	txP, txB, rxP, rxB, credit, nopath, filter, reordered, expired atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{TxPackets: c.txP.Load(), TxBytes: c.txB.Load(), RxPackets: c.rxP.Load(), RxBytes: c.rxB.Load(),
		CreditDrops: c.credit.Load(), NoPathDrops: c.nopath.Load(), FilterDrops: c.filter.Load(), Reordered: c.reordered.Load(),
		ExpiredDrops: c.expired.Load()}
}

// Add returns the sum of s and o.
func (s Stats) Add(o Stats) Stats {
	return Stats{s.TxPackets + o.TxPackets, s.TxBytes + o.TxBytes, s.RxPackets + o.RxPackets, s.RxBytes + o.RxBytes,
		s.CreditDrops + o.CreditDrops, s.NoPathDrops + o.NoPathDrops, s.FilterDrops + o.FilterDrops, s.Reordered + o.Reordered,
		s.ExpiredDrops + o.ExpiredDrops}
}

// session is the K connections one borrower opened to one lease, seen from
// either end: it numbers the packets it sends over them and delivers the
// packets it receives in their sender's order.
type session struct {
	id      uint64
	striped bool // packets of one flow may use any connection
	ctr     *counters
	// deliver takes each packet, in order; it may block (the lender's
	// rate). An error ends the connection the packet came on (an ERROR
	// frame of its status), and with it the session.
	deliver func(pkt []byte) error

	mu      sync.Mutex
	qps     []*qp
	sendSeq uint32
	rr      int

	rmu   sync.Mutex
	next  uint32
	held  map[uint32]heldPkt
	ended bool
}

type heldPkt struct {
	pkt []byte
	q   *qp
}

func newSession(id uint64, conns int, striped bool, ctr *counters, deliver func([]byte) error) *session {
	return &session{id: id, striped: striped, ctr: ctr, deliver: deliver, qps: make([]*qp, conns), held: map[uint32]heldPkt{}}
}

// join installs q as connection i; it reports false if the slot is taken.
func (s *session) join(i int, q *qp) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.qps[i] != nil {
		return false
	}
	s.qps[i] = q
	return true
}

// conns returns the joined connections.
func (s *session) conns() []*qp {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*qp, 0, len(s.qps))
	for _, q := range s.qps {
		if q != nil {
			out = append(out, q)
		}
	}
	return out
}

// send queues pkt on a connection with credit: the one its flow hashes to,
// or with striping the next one round robin that has credit. It reports
// whether the packet was queued; the caller counts the drop.
func (s *session) send(pkt []byte, hash uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.qps)
	seq := func() uint32 { v := s.sendSeq; s.sendSeq++; return v }
	if !s.striped {
		q := s.qps[int(hash%uint32(n))]
		if q == nil {
			// Not joined yet (or gone): any other connection will do.
			for _, o := range s.qps {
				if o != nil {
					q = o
					break
				}
			}
		}
		if q == nil {
			s.ctr.nopath.Add(1)
			return false
		}
		if !q.trySend(pkt, seq) {
			s.ctr.credit.Add(1)
			return false
		}
		return true
	}
	for k := range n {
		q := s.qps[(s.rr+k)%n]
		if q != nil && q.trySend(pkt, seq) {
			s.rr = (s.rr + k + 1) % n
			return true
		}
	}
	s.ctr.credit.Add(1)
	return false
}

// recv is the readers' onData: it delivers packets in sequence order,
// holding those that arrive early.
func (s *session) recv(q *qp, seq uint32, pkt []byte) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.ended {
		return ErrGone
	}
	if seq != s.next {
		if int32(seq-s.next) < 0 {
			return fmt.Errorf("%w: packet %d repeated (expecting %d)", ErrBadFrame, seq, s.next)
		}
		if _, dup := s.held[seq]; dup {
			return fmt.Errorf("%w: packet %d repeated", ErrBadFrame, seq)
		}
		if len(s.held) >= MaxReorder {
			return fmt.Errorf("%w: %d packets held waiting for packet %d", ErrBadFrame, len(s.held), s.next)
		}
		s.held[seq] = heldPkt{append([]byte(nil), pkt...), q}
		s.ctr.reordered.Add(1)
		return nil
	}
	if err := s.deliverOne(q, pkt); err != nil {
		return err
	}
	for {
		h, ok := s.held[s.next]
		if !ok {
			return nil
		}
		delete(s.held, s.next)
		if err := s.deliverOne(h.q, h.pkt); err != nil {
			return err
		}
	}
}

func (s *session) deliverOne(q *qp, pkt []byte) error {
	s.next++
	if err := s.deliver(pkt); err != nil {
		return err
	}
	q.delivered(len(pkt))
	return nil
}

// close ends every connection with err and drops held packets.
func (s *session) close(err error) {
	s.end()
	for _, q := range s.conns() {
		q.fail(err)
	}
}

// closeWith is close, telling the peer err on every connection (an ERROR
// frame of its status) before it ends. It reports whether the session
// was running until then (false: closed before).
func (s *session) closeWith(err error) bool {
	first := s.end()
	for _, q := range s.conns() {
		q.failWith(err)
	}
	return first
}

// end marks the session ended and drops held packets; it reports whether
// it was not ended before.
func (s *session) end() bool {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	first := !s.ended
	s.ended = true
	s.held = map[uint32]heldPkt{}
	return first
}
