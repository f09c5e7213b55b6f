package memorytest

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

// Relay stands between a session and a real donor, one relayed TCP
// connection (plaintext) for each of the session's: bytes go through both
// ways as they come, except that once armed for a kind of connection, the
// first WRITE on a connection of that kind goes through with only the
// first StallSent bytes of its payload, and nothing of that connection
// after them — a payload stalled on its way, as a donor moving the region
// sees one. When the donor closes its side of a connection, the relay
// closes the session's side. It counts the connections of each kind (from
// their HELLO). Armed with Corrupt, it spoils the next reply the donor
// sends on a connection of a kind; armed with Hold, it holds that reply
// back until released.
type Relay struct {
	donor string
	ln    net.Listener
	wg    sync.WaitGroup

	mu       sync.Mutex
	kinds    map[uint8]int
	armed    uint8 // 0: none
	stalled  chan struct{}
	stallOff int64 // the stalled WRITE's offset
	conns    []net.Conn
	// A held stall (ArmHeld): the rest of the payload goes through to
	// the donor once release closes, and landed closes once the donor
	// has ended that connection afterwards.
	release, landed chan struct{}
	// A reply to spoil (Corrupt): on a connection of corruptKind, the
	// next reply but a HELLO's; corrupted closes once it went through.
	corruptKind uint8
	corruptHow  Corruption
	corrupted   chan struct{}
	// A reply to hold (Hold): on a connection of holdKind, the next
	// reply but a HELLO's waits until holdRelease closes; holding
	// closes once it waits.
	holdKind             uint8
	holding, holdRelease chan struct{}
	// stop closes when the test ends: a held reply goes no further.
	stop chan struct{}
}

// Corruption is how Corrupt spoils a reply's header (its payload goes
// through as the donor sent it).
type Corruption int

// Corruptions.
const (
	// CorruptSeq gives the reply another request's sequence number.
	CorruptSeq Corruption = iota + 1
	// CorruptLength gives it a payload length over protocol.MaxPayload.
	CorruptLength
	// CorruptOpcode gives it an opcode the protocol does not know.
	CorruptOpcode
)

func (c Corruption) String() string {
	switch c {
	case CorruptSeq:
		return "seq"
	case CorruptLength:
		return "length"
	case CorruptOpcode:
		return "opcode"
	}
	return "corruption"
}

// Corrupt spoils, as how says, the header of the next reply (not a
// HELLO's) the donor sends on a connection of kind; the channel returned
// closes once it went through to the session.
func (r *Relay) Corrupt(kind uint8, how Corruption) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.corruptKind, r.corruptHow, r.corrupted = kind, how, make(chan struct{})
	return r.corrupted
}

// spoil corrupts h, the header of a reply on a connection of kind, in
// place if Corrupt armed the relay for it, and returns the channel to
// close once it went through (nil: untouched).
func (r *Relay) spoil(kind uint8, h []byte) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.corrupted == nil || kind != r.corruptKind || h[3] == protocol.OpHello {
		return nil
	}
	rh, err := protocol.DecodeHeader(h)
	if err != nil {
		return nil
	}
	switch r.corruptHow {
	case CorruptSeq:
		rh.Seq += 1000
	case CorruptLength:
		rh.Payload = protocol.MaxPayload + 1
	case CorruptOpcode:
		rh.Op = 0x7f
	}
	rh.Encode(h)
	done := r.corrupted
	r.corrupted = nil
	return done
}

// Hold holds back the next reply (not a HELLO's) the donor sends on a
// connection of kind, and what follows it on that connection: held
// closes once the reply is held, and the reply goes through once
// release is closed (late, as a slow network or donor delivers it).
func (r *Relay) Hold(kind uint8) (held <-chan struct{}, release chan<- struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holdKind, r.holding, r.holdRelease = kind, make(chan struct{}), make(chan struct{})
	return r.holding, r.holdRelease
}

// hold waits, if Hold armed the relay for a reply on a connection of
// kind whose header is h, until the reply may go through; false if the
// test ended first.
func (r *Relay) hold(kind uint8, h []byte) bool {
	r.mu.Lock()
	if r.holding == nil || kind != r.holdKind || h[3] == protocol.OpHello {
		r.mu.Unlock()
		return true
	}
	holding, release := r.holding, r.holdRelease
	r.holding, r.holdRelease = nil, nil
	r.mu.Unlock()
	close(holding)
	select {
	case <-release:
		return true
	case <-r.stop:
		return false
	}
}

// StallSent is how many bytes of a stalled WRITE's payload go through.
const StallSent = 100

// StartRelay relays connections to the donor at donor until the test
// ends.
func StartRelay(t testing.TB, donor string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{donor: donor, ln: ln, kinds: map[uint8]int{}, stop: make(chan struct{})}
	r.wg.Go(func() {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() { r.relay(cc) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		close(r.stop)
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// Dial is the session's Options.Dialer: every connection through the
// relay.
func (r *Relay) Dial(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", r.ln.Addr().String())
}

// Arm makes the next WRITE on a connection of kind stall; the channel
// returned closes once its first bytes went through (StallOffset is then
// its offset).
func (r *Relay) Arm(kind uint8) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed, r.stalled = kind, make(chan struct{})
	return r.stalled
}

// ArmHeld is Arm for a payload that is late rather than lost: the rest
// of the stalled WRITE's payload stays on its way until release is
// closed, then goes through to the donor (as a network delivers a
// connection's late segments, whatever the borrower did since), and the
// relay ends its side of that connection; landed closes once the donor
// has closed its side (its handler has returned). If the donor closes it
// first, the rest never goes through.
func (r *Relay) ArmHeld(kind uint8) (stalled <-chan struct{}, release chan<- struct{}, landed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed, r.stalled = kind, make(chan struct{})
	r.release, r.landed = make(chan struct{}), make(chan struct{})
	return r.stalled, r.release, r.landed
}

// StallOffset is the offset of the WRITE that stalled last.
func (r *Relay) StallOffset() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stallOff
}

// Dials is how many connections of each kind the session opened.
func (r *Relay) Dials() map[uint8]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[uint8]int, len(r.kinds))
	for k, n := range r.kinds {
		m[k] = n
	}
	return m
}

func (r *Relay) relay(cc net.Conn) {
	dc, err := net.Dial("tcp", r.donor)
	if err != nil {
		cc.Close()
		return
	}
	r.mu.Lock()
	r.conns = append(r.conns, cc, dc)
	r.mu.Unlock()
	defer cc.Close()
	defer dc.Close()
	ended := make(chan struct{})
	// The connection's kind, from its HELLO, known before any reply.
	var kindOf atomic.Uint32
	r.wg.Go(func() { // the donor's side, frame by frame as it comes
		defer close(ended)
		defer cc.Close() // the donor closed: so does the session's side
		var hdr [protocol.HeaderSize]byte
		for {
			if _, err := io.ReadFull(dc, hdr[:]); err != nil {
				return
			}
			payload := int64(binary.BigEndian.Uint32(hdr[12:]))
			if !r.hold(uint8(kindOf.Load()), hdr[:]) {
				return
			}
			done := r.spoil(uint8(kindOf.Load()), hdr[:])
			if _, err := cc.Write(hdr[:]); err != nil {
				return
			}
			if done != nil {
				close(done)
			}
			if _, err := io.CopyN(cc, dc, payload); err != nil {
				return
			}
		}
	})
	var hdr [protocol.HeaderSize]byte
	kind := uint8(0)
	for {
		if _, err := io.ReadFull(cc, hdr[:]); err != nil {
			return
		}
		h, err := protocol.DecodeHeader(hdr[:])
		if err != nil {
			return
		}
		payload := make([]byte, h.Payload)
		if _, err := io.ReadFull(cc, payload); err != nil {
			return
		}
		if h.Op == protocol.OpHello && kind == 0 && len(payload) > 0 {
			kind = payload[0]
			kindOf.Store(uint32(kind))
			r.mu.Lock()
			r.kinds[kind]++
			r.mu.Unlock()
		}
		r.mu.Lock()
		stall := h.Op == protocol.OpWrite && kind == r.armed && len(payload) > StallSent
		var stalled, release, landed chan struct{}
		var rest []byte
		if stall {
			r.armed, stalled, r.stallOff = 0, r.stalled, int64(h.Offset)
			release, landed = r.release, r.landed
			r.release, r.landed = nil, nil
			payload, rest = payload[:StallSent], payload[StallSent:]
		}
		r.mu.Unlock()
		if _, err := dc.Write(append(hdr[:], payload...)); err != nil {
			return
		}
		if stall {
			close(stalled)
			if release == nil {
				<-ended // the rest never goes through
				return
			}
			defer close(landed)
			select {
			case <-release:
				_, _ = dc.Write(rest)
				_ = dc.(*net.TCPConn).CloseWrite()
			case <-ended:
			}
			<-ended
			return
		}
	}
}
