package nic

import (
	"bytes"
	"context"
	"github.com/rialto-project/rialto/internal/logtest"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// lenderHere runs a Lender of lender k's wan0 in this process, its kernel
// work (TUN interfaces, nftables) in k's namespace and its listener there,
// as the agent's NIC driver runs it; it logs to log.
func (r *rack) lenderHere(t *testing.T, k int, log *slog.Logger, leases ...LeaseSpec) *Lender {
	t.Helper()
	ctx := context.Background()
	var l *Lender
	if err := r.lab.Do(lender0+k, func() error {
		var err error
		l, err = NewLender(ctx, LenderConfig{Iface: "wan0", Logger: log})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.lab.Do(lender0+k, l.Close) })
	for _, ls := range leases {
		if err := r.lab.Do(lender0+k, func() error { return l.AddLease(ctx, ls) }); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := r.lab.Listen(ctx, lender0+k, "tcp", r.lenderAddr(k))
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- l.Serve(sctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })
	return l
}

// attachHere attaches m in this process, the interface (rnic0) in host's
// namespace, dialling from there, routing only the outside's server
// through it; it logs to log.
func (r *rack) attachHere(t *testing.T, host int, log *slog.Logger, m Member) *Interface {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ifc *Interface
	if err := r.lab.Do(host, func() error {
		var err error
		ifc, err = Attach(ctx, Config{Members: []Member{m}, Name: "rnic0", Logger: log,
			Routes: []netip.Prefix{netip.PrefixFrom(r.out.Server, 32)},
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return r.lab.Dial(ctx, host, network, addr)
			}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.lab.Do(host, ifc.Close) })
	return ifc
}

// waitMember waits until the interface's first member is in the state
// ok accepts, and returns it.
func waitMember(t *testing.T, ifc *Interface, what string, ok func(MemberStatus) bool) MemberStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		m := ifc.Members()[0]
		if ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the borrower's lender is %+v", what, m)
		}
		<-tick.C
	}
}

// TestDeadlineRefusesLateFrames: a lease's deadline (its known expiry,
// Lender.SetLeaseDeadline) drops every packet the lender would forward
// once it has passed, though nobody has removed the lease (the agent's
// stop at the expiry has not come): one from the outside to the borrower,
// and, after a renewal, one from the borrower to the outside. Each ends
// the session with the reason, which the borrower reports (its member's
// Err and its log); its redial is refused with it until the deadline
// moves (a renewal), after which it is welcome and the lease carries
// packets again, both ways.
func TestDeadlineRefusesLateFrames(t *testing.T) {
	r := newRack(t, 1, "")
	var lenderLog, borrowerLog logtest.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lender:\n%s\nborrower:\n%s", lenderLog.String(), borrowerLog.String())
		}
	})
	t0 := time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC)
	clk := clock.NewFake(t0.Add(-time.Second))
	dl := clock.NewDeadline(clk)
	dl.Set(t0)
	lease := testLease("expiring", 0)
	l := r.lenderHere(t, 0, slog.New(slog.NewTextHandler(&lenderLog, nil)), lease)
	if err := l.SetLeaseDeadline(lease.ID, dl); err != nil {
		t.Fatal(err)
	}
	ifc := r.attachHere(t, 0, slog.New(slog.NewTextHandler(&borrowerLog, nil)), testMember(r, 0, lease))
	u := newUDPEnds(t, r, ifc.Addr())
	u.up(t, []byte("up, before the deadline"))
	u.down(t, []byte("down, before the deadline"))
	stats := func() Stats {
		info, ok := l.Lease(lease.ID)
		if !ok {
			t.Fatal("the lease is gone from the lender")
		}
		return info.Stats
	}
	// expired waits for the borrower to report its session ended at the
	// deadline at, then for its redial to be refused likewise.
	expired := func(at time.Time) {
		t.Helper()
		reason := "lease " + lease.ID + " expired at " + at.Format(time.RFC3339Nano)
		// The session's end ("lease ended: REASON"), or already the
		// refusal of the redial that follows it ("lease ended (REASON)").
		m := waitMember(t, ifc, "the session at the deadline", func(m MemberStatus) bool { return !m.Up && m.Err != "" })
		if !strings.Contains(m.Err, reason) {
			t.Fatalf("the borrower's session ended with %q, want the lender's reason %q", m.Err, reason)
		}
		if said := `msg="nic: the lender ended the lease's session" lender=` + r.lenderAddr(0) + ` err="nic: lease ended: ` + reason + `"`; !strings.Contains(borrowerLog.String(), said) {
			t.Errorf("the borrower's log does not say %s:\n%s", said, borrowerLog.String())
		}
		waitMember(t, ifc, "a redial after the deadline", func(m MemberStatus) bool {
			return strings.Contains(m.Err, "nic: lease ended ("+reason+")")
		})
	}

	// notArrived fails the test if msg reaches rc (within a second,
	// though the session it would have crossed has ended).
	notArrived := func(rc *net.UDPConn, msg []byte) {
		t.Helper()
		buf := make([]byte, 2048)
		_ = rc.SetReadDeadline(time.Now().Add(time.Second))
		for {
			n, _, err := rc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if bytes.Equal(buf[:n], msg) {
				t.Fatalf("%q crossed the lent NIC after the deadline", msg)
			}
		}
	}

	// Down: the outside's datagram reaches the lender at the deadline.
	clk.Advance(time.Second) // the deadline, to the nanosecond
	before := stats()
	late := []byte("down, at the deadline")
	if _, err := u.o.WriteToUDP(late, u.from); err != nil {
		t.Fatal(err)
	}
	expired(t0)
	if after := stats(); after.ExpiredDrops == before.ExpiredDrops {
		t.Fatal("the lender counted no packet dropped after the deadline")
	}
	notArrived(u.b, late)

	// Renewed: the borrower's redial is welcome, packets cross again.
	dl.Set(t0.Add(time.Minute))
	waitMember(t, ifc, "a redial after the renewal", func(m MemberStatus) bool { return m.Up })
	u.up(t, []byte("up, after the renewal"))
	u.down(t, []byte("down, after the renewal"))

	// Up: the borrower's datagram reaches the lender at the new deadline.
	clk.Advance(time.Minute)
	before = stats()
	late = []byte("up, at the deadline")
	if _, err := u.b.Write(late); err != nil {
		t.Fatal(err)
	}
	expired(t0.Add(time.Minute))
	if after := stats(); after.ExpiredDrops == before.ExpiredDrops {
		t.Fatal("the lender counted no packet dropped after the deadline")
	}
	notArrived(u.o, late)
}

// TestLeaseAddedExpiredRefusesFirstHello: a lease added with its
// deadline in its spec (LeaseSpec.Deadline, as the agent adds it) is
// judged against it from its first HELLO on: added with its deadline
// passed, that HELLO is refused (StatusGone, saying when the lease
// expired); added again with a renewed deadline, the next is welcome.
// Before, the agent added the lease, then set its deadline
// (SetLeaseDeadline): a HELLO in between joined a lease with none.
func TestLeaseAddedExpiredRefusesFirstHello(t *testing.T) {
	r := newRack(t, 1, "")
	t0 := time.Date(2026, 1, 1, 13, 40, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	dl := clock.NewDeadline(clk)
	dl.Set(t0.Add(-time.Second))
	lease := testLease("born-expired", 0)
	lease.Deadline = dl
	l := r.lenderHere(t, 0, slog.New(slog.DiscardHandler), lease)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// hello sends a HELLO for the lease from host 0 and returns the
	// lender's WELCOME.
	hello := func() Welcome {
		t.Helper()
		c, err := r.lab.Dial(ctx, 0, "tcp", r.lenderAddr(0))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		hb := (&Hello{Conns: 1, Session: uint64(time.Now().UnixNano()), Window: DefaultWindow, MTU: 1500, Lease: LeaseID(lease.Credential)}).Encode(nil)
		if _, err := c.Write(hb); err != nil {
			t.Fatal(err)
		}
		ch, refused, err := ReadChallenge(c)
		if err != nil || refused != nil {
			t.Fatalf("challenge: %v %+v", err, refused)
		}
		proof := Proof(lease.Credential, ch, hb)
		if _, err := c.Write(proof[:]); err != nil {
			t.Fatal(err)
		}
		w, err := ReadWelcome(c)
		if err != nil {
			t.Fatalf("welcome: %v", err)
		}
		return w
	}
	reason := "lease " + lease.ID + " expired at " + t0.Add(-time.Second).Format(time.RFC3339Nano)
	if w := hello(); w.Status != StatusGone || !strings.Contains(w.Message, reason) {
		t.Fatalf("the first HELLO of a lease added past its deadline: status %d (%q), want %d (gone) saying %q", w.Status, w.Message, StatusGone, reason)
	}
	renewed := clock.NewDeadline(clk)
	renewed.Set(t0.Add(time.Minute))
	lease.Deadline = renewed
	if err := r.lab.Do(lender0, func() error { return l.AddLease(ctx, lease) }); err != nil {
		t.Fatalf("the lease added again with a renewed deadline: %v", err)
	}
	if w := hello(); w.Status != StatusOK {
		t.Fatalf("a HELLO once the lease was added again with a renewed deadline: status %d (%q), want OK", w.Status, w.Message)
	}
}
