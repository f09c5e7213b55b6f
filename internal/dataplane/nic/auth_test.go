package nic

import (
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

// relay forwards connections to a lender and records what the first one's
// borrower sent: a passive observer of the wire.
type relay struct {
	ln      net.Listener
	to      string
	accepts atomic.Int32
	wg      sync.WaitGroup

	mu    sync.Mutex
	sent  []byte // borrower → lender bytes of the first connection
	conns []net.Conn
}

func startRelay(t *testing.T, listen, to string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, to: to}
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
			r.mu.Lock()
			r.conns = append(r.conns, c, u)
			r.mu.Unlock()
			r.wg.Add(2)
			go func() {
				defer r.wg.Done()
				defer u.Close()
				var w io.Writer = u
				if first {
					w = io.MultiWriter(r, u) // recorded before the lender gets it
				}
				_, _ = io.Copy(w, c)
			}()
			go func() {
				defer r.wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, u)
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

// Write records borrower bytes.
func (r *relay) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, p...)
	return len(p), nil
}

func (r *relay) recorded() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.sent)
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
