package nic

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// relay forwards connections to a lender: an attacker on the path. It
// records what crosses, each way, and on request tampers with the latest
// connection's streams (pipe.inject, pipe.flipNext) at a boundary of
// what they carry, as cut by its framing.
type relay struct {
	ln      net.Listener
	to      string
	framing framing
	accepts atomic.Int32
	wg      sync.WaitGroup

	mu    sync.Mutex
	sent  []byte    // borrower → lender bytes of the first connection
	all   [2][]byte // every connection's bytes: [0] borrower → lender, [1] lender → borrower
	conns []net.Conn
	last  *relayConn // the latest connection
}

// framing is how a relay cuts a stream into the units it tampers
// between.
type framing int

const (
	rawBytes  framing = iota // no cutting: pipes cannot tamper
	tlsRecord                // TLS records (5-byte headers)
	plainNIC                 // the plaintext tunnel's HELLO, PROOF, then frames (borrower → lender only)
)

// relayConn is one relayed connection: its two pipes and done, closed
// once both have ended (the connection is over).
type relayConn struct {
	pipes [2]*pipe // [0] borrower → lender, [1] lender → borrower
	done  chan struct{}
}

// pipe is one direction of a relayed connection.
type pipe struct {
	mu   sync.Mutex
	w    net.Conn
	flip bool   // flip a byte of the next TLS application-data record
	off  uint32 // plainNIC: added to the seq of DATA frames after injections
	next uint32 // plainNIC: the seq the next DATA frame has, as forwarded
}

// inject writes b into the stream between two units.
func (p *pipe) inject(b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.w.Write(b)
	return err
}

// injectData injects a DATA frame carrying pkt, numbered to be the next
// packet (plainNIC: the frames after it are renumbered).
func (p *pipe) injectData(pkt []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var h [HeaderSize]byte
	Header{Type: FrameData, Length: uint16(len(pkt)), Seq: p.next}.Encode(h[:])
	if _, err := p.w.Write(append(h[:], pkt...)); err != nil {
		return err
	}
	p.off++
	p.next++
	return nil
}

// flipNext flips a byte in the body of the next application-data record.
func (p *pipe) flipNext() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flip = true
}

// forward copies r to p.w unit by unit, recording what it forwards.
func (p *pipe) forward(r io.Reader, f framing, record func([]byte)) {
	if f == rawBytes {
		_, _ = io.Copy(io.MultiWriter(writerFunc(func(b []byte) (int, error) { record(b); return len(b), nil }), p.w), r)
		return
	}
	br := bufio.NewReader(r)
	units := 0
	for {
		var unit []byte
		switch {
		case f == tlsRecord:
			var h [5]byte
			if _, err := io.ReadFull(br, h[:]); err != nil {
				return
			}
			unit = make([]byte, 5+int(binary.BigEndian.Uint16(h[3:])))
			copy(unit, h[:])
			if _, err := io.ReadFull(br, unit[5:]); err != nil {
				return
			}
		case units < 2: // plainNIC: HELLO, PROOF
			unit = make([]byte, HelloSize)
			if units == 1 {
				unit = unit[:ProofSize]
			}
			if _, err := io.ReadFull(br, unit); err != nil {
				return
			}
		default: // plainNIC: a frame
			var h [HeaderSize]byte
			if _, err := io.ReadFull(br, h[:]); err != nil {
				return
			}
			unit = make([]byte, HeaderSize+int(binary.BigEndian.Uint16(h[2:])))
			copy(unit, h[:])
			if _, err := io.ReadFull(br, unit[HeaderSize:]); err != nil {
				return
			}
		}
		units++
		record(unit)
		p.mu.Lock()
		switch {
		case f == tlsRecord && p.flip && unit[0] == 23 && len(unit) > 5:
			unit[5+(len(unit)-5)/2] ^= 0x40
			p.flip = false
		case f == plainNIC && units > 2 && unit[0] == FrameData:
			seq := binary.BigEndian.Uint32(unit[4:]) + p.off
			binary.BigEndian.PutUint32(unit[4:], seq)
			p.next = seq + 1
		}
		_, err := p.w.Write(unit)
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func startRelay(t *testing.T, listen, to string) *relay {
	return startFramingRelay(t, listen, to, rawBytes)
}

func startFramingRelay(t *testing.T, listen, to string, f framing) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, to: to, framing: f}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			first := r.accepts.Add(1) == 1
			u, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			rc := &relayConn{pipes: [2]*pipe{{w: u}, {w: c}}, done: make(chan struct{})}
			r.mu.Lock()
			r.conns = append(r.conns, c, u)
			r.last = rc
			r.mu.Unlock()
			var both sync.WaitGroup
			both.Add(2)
			r.wg.Add(3)
			go func() {
				defer r.wg.Done()
				both.Wait()
				close(rc.done)
			}()
			go func() {
				defer r.wg.Done()
				defer both.Done()
				defer u.Close()
				rc.pipes[0].forward(c, f, func(b []byte) {
					r.mu.Lock()
					defer r.mu.Unlock()
					if first {
						r.sent = append(r.sent, b...) // recorded before the lender gets it
					}
					r.all[0] = append(r.all[0], b...)
				})
			}()
			go func() {
				defer r.wg.Done()
				defer both.Done()
				defer c.Close()
				df := f
				if df == plainNIC {
					df = rawBytes
				}
				rc.pipes[1].forward(u, df, func(b []byte) {
					r.mu.Lock()
					defer r.mu.Unlock()
					r.all[1] = append(r.all[1], b...)
				})
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *relay) recorded() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.sent)
}

// recordedAll is what crossed the relay in direction dir (0: borrower →
// lender, 1: lender → borrower) on every connection.
func (r *relay) recordedAll(dir int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.all[dir])
}

// latest is the latest connection.
func (r *relay) latest() *relayConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// replayHandshake dials the lender and sends a recorded HELLO, then the
// recorded PROOF in answer to whatever challenge the lender draws; it
// returns the lender's WELCOME.
func replayHandshake(addr string, hello, proof []byte) (Welcome, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return Welcome{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(hello); err != nil {
		return Welcome{}, err
	}
	_, refused, err := ReadChallenge(c)
	if err != nil {
		return Welcome{}, fmt.Errorf("challenge: %w", err)
	}
	if refused != nil {
		return *refused, nil
	}
	if _, err := c.Write(proof); err != nil {
		return Welcome{}, err
	}
	return ReadWelcome(c)
}

// TestSniffedHelloCannotTakeOverLease: an observer of the plaintext tunnel
// records a borrower's handshake and replays it to the lender, as is and
// with a session id of its own (which would replace the borrower's
// session). The record does not hold the credential, the lender refuses
// both, and the borrower's session goes on untouched.
func TestSniffedHelloCannotTakeOverLease(t *testing.T) {
	r := newRack(t, 1, "")
	la := testLease("sniffed", 0)
	r.startLender(t, 0, la)
	rl := startRelay(t, net.JoinHostPort(r.lab.Gateway().String(), "0"), r.lenderAddr(0))
	pb, _ := r.attach(t, 0, borrowerSpec{Members: []Member{{Addr: rl.ln.Addr().String(), Credential: la.Credential}}, Name: "rnic0"})
	server := r.out.Server.String()
	if !r.ping(0, server) {
		t.Fatal("no ping through the lent NIC")
	}

	rec := rl.recorded()
	if len(rec) < HelloSize+ProofSize {
		t.Fatalf("recorded %d bytes of handshake", len(rec))
	}
	if bytes.Contains(rec, []byte(la.Credential)) {
		t.Fatal("the credential crossed the wire in clear")
	}
	hello, proof := rec[:HelloSize], rec[HelloSize:HelloSize+ProofSize]
	h, err := DecodeHello(hello)
	if err != nil {
		t.Fatalf("recorded HELLO: %v", err)
	}
	if h.Lease != LeaseID(la.Credential) {
		t.Fatal("the recorded HELLO names another lease")
	}
	newSession := bytes.Clone(hello)
	binary.BigEndian.PutUint64(newSession[8:], h.Session^0x5a5a)
	for _, c := range []struct {
		what  string
		hello []byte
	}{{"replayed as is", hello}, {"replayed with a new session id", newSession}} {
		w, err := replayHandshake(r.lenderAddr(0), c.hello, proof)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if w.Status != StatusAuth {
			t.Errorf("%s: the lender answered status %d (%s), want %d", c.what, w.Status, w.Message, StatusAuth)
		}
	}

	// The borrower's session is the one it had: still up, never redialled.
	if !r.ping(0, server) {
		t.Error("no ping through the lent NIC after the replays")
	}
	rep := pb.report(t)
	if !rep.Members[0].Up || rep.Members[0].Err != "" {
		t.Errorf("borrower's member after the replays: %+v", rep.Members[0])
	}
	if n := rl.accepts.Load(); n != 1 {
		t.Errorf("the borrower connected %d times: its session was lost", n)
	}
}

type raceReport struct {
	Status     uint8  `json:"status"`
	Message    string `json:"message"`
	Registered bool   `json:"registered"`
	Err        string `json:"err"`
}

// helperRace runs in a lender's namespace: a HELLO found its lease just
// before RemoveLease took it out; the hooks then run the rest of the
// HELLO between RemoveLease's bookkeeping and its end of the lease, the
// window where a session could be registered for an ended lease.
func helperRace() int {
	var spec lenderSpec
	if err := json.Unmarshal([]byte(os.Getenv("NIC_SPEC")), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rep, err := runRace(spec)
	if err != nil {
		rep.Err = err.Error()
	}
	b, _ := json.Marshal(rep)
	fmt.Println(string(b))
	return 0
}

func runRace(spec lenderSpec) (raceReport, error) {
	ctx := context.Background()
	l, err := NewLender(ctx, LenderConfig{Iface: spec.Iface})
	if err != nil {
		return raceReport{}, err
	}
	defer l.Close()
	lspec := spec.Leases[0]
	if err := l.AddLease(ctx, lspec); err != nil {
		return raceReport{}, err
	}
	l.mu.Lock()
	ls := l.leases[lspec.ID]
	l.mu.Unlock()

	found, proceed, joining, taken := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var onceFound, onceProceed, onceJoining, onceTaken sync.Once
	l.hook = func(p string) {
		switch p {
		case "hello.found": // the HELLO found the lease: let RemoveLease run
			onceFound.Do(func() { close(found) })
			<-proceed
		case "remove.unlocked": // the lease is out of the maps: let the HELLO join
			onceProceed.Do(func() { close(proceed) })
			<-joining
		case "join.checked": // join saw the lease alive: let the lease end first
			onceJoining.Do(func() { close(joining) })
			<-taken
		case "hello.joined":
			onceJoining.Do(func() { close(joining) })
		case "end.taken":
			onceTaken.Do(func() { close(taken) })
		}
	}
	ln, err := net.Listen("tcp", spec.Listen)
	if err != nil {
		return raceReport{}, err
	}
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- l.Serve(sctx, ln) }()
	defer func() { cancel(); <-served }()

	c, err := net.Dial("tcp", spec.Listen)
	if err != nil {
		return raceReport{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	hb := (&Hello{Conns: 1, Session: 7, Window: DefaultWindow, MTU: 1500, Lease: LeaseID(lspec.Credential)}).Encode(nil)
	if _, err := c.Write(hb); err != nil {
		return raceReport{}, err
	}
	ch, refused, err := ReadChallenge(c)
	if err != nil || refused != nil {
		return raceReport{}, fmt.Errorf("challenge: %v %+v", err, refused)
	}
	proof := Proof(lspec.Credential, ch, hb)
	if _, err := c.Write(proof[:]); err != nil {
		return raceReport{}, err
	}
	<-found
	removed := make(chan error, 1)
	go func() { removed <- l.RemoveLease(ctx, lspec.ID) }()
	w, err := ReadWelcome(c)
	if err != nil && !errors.Is(err, io.EOF) {
		return raceReport{}, fmt.Errorf("welcome: %w", err)
	}
	if err := <-removed; err != nil {
		return raceReport{}, err
	}
	ls.mu.Lock()
	registered := ls.sess != nil
	ls.mu.Unlock()
	return raceReport{Status: w.Status, Message: w.Message, Registered: registered}, nil
}

// TestHelloRacingRemoveLease: a HELLO that found its lease just before
// RemoveLease ends it gets StatusGone, and no session is left registered
// for the ended lease.
func TestHelloRacingRemoveLease(t *testing.T) {
	r := newRack(t, 1, "")
	_, line := startHelper(t, r.lab, lender0, "race", lenderSpec{Iface: "wan0", Listen: r.lenderAddr(0), Leases: []LeaseSpec{testLease("race", 0)}})
	var rep raceReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		t.Fatalf("%v: %q", err, line)
	}
	if rep.Err != "" {
		t.Fatal(rep.Err)
	}
	if rep.Registered {
		t.Error("a session is registered for the ended lease")
	}
	if rep.Status != StatusGone {
		t.Errorf("the racing HELLO got status %d (%s), want %d (gone)", rep.Status, rep.Message, StatusGone)
	}
}

// TestVersion1HelloRefused: a borrower of version 1 (whose HELLO carries
// the credential) is answered StatusVersion as soon as its first 8 bytes
// arrive, before its credential is read.
func TestVersion1HelloRefused(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveConn(b, func([LeaseIDSize]byte) *lease { t.Error("a version 1 HELLO was looked up"); return nil })
		b.Close()
	}()
	v1 := make([]byte, 8)
	binary.BigEndian.PutUint32(v1, Magic)
	v1[4], v1[5] = 1, 1
	if _, err := a.Write(v1); err != nil {
		t.Fatal(err)
	}
	w, err := ReadWelcome(a)
	if err != nil {
		t.Fatal(err)
	}
	if w.Status != StatusVersion {
		t.Fatalf("status %d (%s), want %d", w.Status, w.Message, StatusVersion)
	}
	<-done
}

// TestProofBindsHello: the proof changes with the credential, the
// challenge and every byte of the HELLO.
func TestProofBindsHello(t *testing.T) {
	h := (&Hello{Conns: 2, Index: 1, Session: 42, Window: 1 << 20, MTU: 1500, Lease: LeaseID("cred")}).Encode(nil)
	ch := [ChallengeSize]byte{9}
	p := Proof("cred", ch, h)
	if Proof("cred2", ch, h) == p || Proof("cred", [ChallengeSize]byte{8}, h) == p {
		t.Fatal("the proof ignores the credential or the challenge")
	}
	for i := range h {
		h2 := bytes.Clone(h)
		h2[i] ^= 1
		if Proof("cred", ch, h2) == p {
			t.Fatalf("the proof ignores HELLO byte %d", i)
		}
	}
}
