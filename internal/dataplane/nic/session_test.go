package nic

import (
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// pkt builds a minimal IPv4 packet of n bytes whose identification is id.
func pkt(n int, id uint16) []byte {
	p := make([]byte, n)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(n))
	binary.BigEndian.PutUint16(p[4:], id)
	p[9] = 17
	return p
}

// pair returns two sessions of conns connections each, over loopback TCP.
func pair(t *testing.T, conns int, window uint32, deliverA, deliverB func([]byte)) (a, b *session) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a = newSession(1, conns, conns > 1, &counters{}, func(p []byte) error { deliverA(p); return nil })
	b = newSession(1, conns, conns > 1, &counters{}, func(p []byte) error { deliverB(p); return nil })
	var wg sync.WaitGroup
	for k := range conns {
		ca, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		cb, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		qa, qb := newQP(ca, window, window, time.Second), newQP(cb, window, window, time.Second)
		a.join(k, qa)
		b.join(k, qb)
		wg.Add(2)
		go func() { defer wg.Done(); _ = qa.run(func(s uint32, p []byte) error { return a.recv(qa, s, p) }) }()
		go func() { defer wg.Done(); _ = qb.run(func(s uint32, p []byte) error { return b.recv(qb, s, p) }) }()
	}
	t.Cleanup(func() { a.close(ErrClosed); b.close(ErrClosed); wg.Wait() })
	return a, b
}

// TestStripedInOrder: packets striped over four connections arrive in
// the order they were sent, and credits come back so that a long run
// never stalls.
func TestStripedInOrder(t *testing.T) {
	var mu sync.Mutex
	var got []uint16
	done := make(chan struct{})
	const n = 20000
	a, _ := pair(t, 4, 64<<10, func([]byte) {}, func(p []byte) {
		mu.Lock()
		got = append(got, binary.BigEndian.Uint16(p[4:]))
		if len(got) == n {
			close(done)
		}
		mu.Unlock()
	})
	deadline := time.Now().Add(30 * time.Second)
	for id := 0; id < n; {
		if a.send(pkt(200+id%1200, uint16(id)), 0) {
			id++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("stalled after %d packets: no credit came back", id)
		}
		time.Sleep(100 * time.Microsecond) // the sender polls for credit like a NIC ring
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("received %d of %d", len(got), n)
	}
	want := make([]uint16, n)
	for i := range want {
		want[i] = uint16(i)
	}
	if !slices.Equal(got, want) {
		t.Fatal("packets delivered out of order")
	}
}

// TestCreditEnforced: a sender within the window drops what does not fit
// rather than queueing it; a sender beyond the window is cut off with
// ErrCredit (here while its packets are held, waiting for an earlier one
// that never comes, so nothing is consumed).
func TestCreditEnforced(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ca, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	recv := newQP(cb, 8192, 8192, time.Second)
	s := newSession(1, 2, true, &counters{}, func([]byte) error { return nil })
	s.join(1, recv)
	errc := make(chan error, 1)
	go func() { errc <- recv.run(func(sq uint32, p []byte) error { return s.recv(recv, sq, p) }) }()
	send := newQP(ca, 8192, 8192, time.Second)
	go send.writeLoop()
	defer send.fail(ErrClosed)
	seq := uint32(1) // packet 0 never comes
	next := func() uint32 { v := seq; seq++; return v }
	sent := 0
	for range 10 {
		if send.trySend(pkt(1000, 0), next) {
			sent++
		}
	}
	if sent != 8 {
		t.Fatalf("sent %d 1000-byte packets into an 8192-byte window", sent)
	}
	send.mu.Lock()
	send.granted = 1 << 30 // ignore the window from now on
	send.mu.Unlock()
	for range 4 {
		send.trySend(pkt(1000, 0), next)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrCredit) {
			t.Fatalf("receiver ended with %v, want ErrCredit", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("receiver accepted data beyond its window")
	}
}

// TestFlowTable: few flows spread evenly over the members (by weight);
// a flow stays on its member; when a member is lost only its flows move,
// and idle flows are forgotten.
func TestFlowTable(t *testing.T) {
	ft := newFlowTable(3)
	w := func(m int) float64 { return []float64{1, 1, 2}[m] }
	now := time.Unix(1000, 0)
	all := []int{0, 1, 2}
	first := map[uint32]int{}
	count := [3]int{}
	for h := range uint32(8) {
		m := ft.pick(h*7919, all, w, now)
		first[h*7919] = m
		count[m]++
	}
	if count != [3]int{2, 2, 4} {
		t.Errorf("8 flows over weights 1, 1, 2: %v", count)
	}
	for h, m := range first {
		if got := ft.pick(h, all, w, now.Add(time.Second)); got != m {
			t.Fatalf("flow %d moved from %d to %d", h, m, got)
		}
	}
	survivors := []int{0, 2}
	for h, m := range first {
		got := ft.pick(h, survivors, w, now.Add(2*time.Second))
		if m != 1 && got != m {
			t.Errorf("flow %d of surviving member %d moved to %d", h, m, got)
		}
		if got == 1 {
			t.Errorf("flow %d stays on the lost member", h)
		}
	}
	ft.pick(1, all, w, now.Add(flowIdle+time.Hour)) // sweeps
	if len(ft.flows) != 1 || ft.load[0]+ft.load[1]+ft.load[2] != 1 {
		t.Errorf("after the idle sweep: %d flows, load %v", len(ft.flows), ft.load)
	}
}
