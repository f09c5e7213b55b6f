package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/mct"
	"golang.org/x/sys/unix"
)

func udpAppliance(t *testing.T, role roles.Spec) (*Appliance, string, []byte) {
	t.Helper()
	a := start(t, Config{Slots: 2, SlotMemory: 1 << 16, UDPQueues: 3, Workers: 3})
	if err := a.Load(context.Background(), 1, role); err != nil {
		t.Fatal(err)
	}
	cred := []byte("udp-credential-1")
	if err := a.SetCredential(1, cred); err != nil {
		t.Fatal(err)
	}
	addr, err := a.UDPAddr(1)
	if err != nil || addr == "" {
		t.Fatalf("UDPAddr: %q, %v", addr, err)
	}
	return a, addr, cred
}

func TestUDPEcho(t *testing.T) {
	a, addr, cred := udpAppliance(t, roles.Spec{Name: "echo"})
	ctx := context.Background()
	if _, err := DialUDP(ctx, addr, []byte("wrong"), "echo"); err == nil || !strings.Contains(err.Error(), "credential") {
		t.Fatalf("a wrong credential: %v", err)
	}
	c, err := DialUDP(ctx, addr, cred, "echo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte{0xab}, 64)
	out, err := c.Call(ctx, msg, 2*time.Second)
	if err != nil || !bytes.Equal(out, msg) {
		t.Fatalf("echo: %x, %v", out, err)
	}
	// A forged session gets an error, not an answer.
	forged := &UDPClient{c: c.c, session: c.session + 2, buf: make([]byte, 65536)}
	if _, err := forged.Call(ctx, msg, 2*time.Second); err == nil || !strings.Contains(err.Error(), "unknown session") {
		t.Fatalf("forged session: %v", err)
	}
	// A new lease ends the session.
	if err := a.SetCredential(1, []byte("next-borrower")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, msg, 2*time.Second); err == nil || !strings.Contains(err.Error(), "lease has ended") {
		t.Fatalf("after the lease ended: %v", err)
	}
	if st, _ := a.Slot(1); st.Tasks == 0 {
		t.Error("UDP requests not counted as the slot's tasks")
	}
}

// TestUDPMCTBatched: many requests in flight at once (so the slot's
// workers receive and answer them in batches) get the answers the MCT
// engine gives directly, each to its own request.
func TestUDPMCTBatched(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	rs := mct.Generate(r, 500)
	cfg, _ := json.Marshal(rs)
	_, addr, cred := udpAppliance(t, roles.Spec{Name: "mct", Config: cfg})
	eng, err := mct.Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := eng.EncodeAll(mct.GenerateQueries(r, 2000))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, len(qs)/mct.QuerySize*mct.ResultSize)
	if err := eng.MatchBatch(qs, want); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := DialUDP(ctx, addr, cred, "match")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := len(qs) / mct.QuerySize
	got := map[uint32][]byte{}
	buf := make([]byte, 65536)
	deadline := time.Now().Add(30 * time.Second)
	for base := 0; base < n; base += 32 {
		end := min(base+32, n)
		for tries := 0; ; tries++ {
			for i := base; i < end; i++ {
				if _, ok := got[uint32(i)]; ok {
					continue
				}
				q := qs[i*mct.QuerySize : (i+1)*mct.QuerySize]
				if _, err := c.c.Write(AppendUDP(nil, UDPHeader{Op: UDPReq, Seq: uint32(i), Session: c.session}, q)); err != nil {
					t.Fatal(err)
				}
			}
			_ = c.c.SetReadDeadline(time.Now().Add(time.Second))
			for missing(got, base, end) {
				k, err := c.c.Read(buf)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				h, p, err := DecodeUDP(buf[:k])
				if err != nil || h.Op != UDPResp {
					t.Fatalf("reply %+v %q: %v", h, p, err)
				}
				got[h.Seq] = append([]byte(nil), p...)
			}
			if !missing(got, base, end) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("requests %d..%d unanswered", base, end)
			}
		}
	}
	for i := range n {
		if w := want[i*mct.ResultSize : (i+1)*mct.ResultSize]; !bytes.Equal(got[uint32(i)], w) {
			t.Fatalf("query %d: %x, want %x", i, got[uint32(i)], w)
		}
	}
}

func missing(got map[uint32][]byte, from, to int) bool {
	for i := from; i < to; i++ {
		if _, ok := got[uint32(i)]; !ok {
			return true
		}
	}
	return false
}

func FuzzDecodeUDP(f *testing.F) {
	f.Add(AppendUDP(nil, UDPHeader{Op: UDPHello, Seq: 1}, HelloPayload("echo", []byte("cred"))))
	f.Add(AppendUDP(nil, UDPHeader{Op: UDPReq, Seq: 9, Session: 77}, make([]byte, 64)))
	f.Add([]byte("RU"))
	f.Fuzz(func(t *testing.T, d []byte) {
		h, p, err := DecodeUDP(d)
		if err != nil {
			if !errors.Is(err, ErrBadDatagram) {
				t.Fatalf("%v does not wrap ErrBadDatagram", err)
			}
			return
		}
		if !bytes.Equal(AppendUDP(nil, h, p), d) {
			t.Fatal("re-encoding differs")
		}
		if h.Op == UDPHello {
			if e, c, err := DecodeHelloPayload(p); err == nil && (e == "" || len(c) == 0) {
				t.Fatal("empty entry or credential accepted")
			}
		}
	})
}

// TestUDPFollowsRebind: a running slot moved by Rebind serves UDP at its
// new address.
func TestUDPFollowsRebind(t *testing.T) {
	a, _, cred := udpAppliance(t, roles.Spec{Name: "echo"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := a.Rebind(1, addr); err != nil {
		t.Skipf("port taken meanwhile: %v", err)
	}
	c, err := DialUDP(context.Background(), addr, cred, "echo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := c.Call(context.Background(), []byte("moved"), 2*time.Second); err != nil || string(out) != "moved" {
		t.Fatalf("after Rebind: %q, %v", out, err)
	}
}

// TestRebindRefusesSharedUDPPort: a port another socket holds with
// SO_REUSEPORT (any process of the same user could) is refused rather than
// shared (the kernel would hand that socket part of the slot's datagrams);
// the slot keeps serving at its address.
func TestRebindRefusesSharedUDPPort(t *testing.T) {
	a, addr, cred := udpAppliance(t, roles.Spec{Name: "echo"})
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	foreign, err := lc.ListenPacket(context.Background(), "udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	taken := foreign.LocalAddr().String()
	if ln, err := net.Listen("tcp", taken); err != nil {
		t.Skipf("TCP port taken: %v", err)
	} else {
		ln.Close()
	}
	if err := a.Rebind(1, taken); err == nil {
		t.Fatalf("Rebind to %s shared its UDP port with another socket", taken)
	}
	if now, _ := a.UDPAddr(1); now != addr {
		t.Fatalf("slot moved to %s after a failed Rebind", now)
	}
	c, err := DialUDP(context.Background(), addr, cred, "echo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := c.Call(context.Background(), []byte("stayed"), 2*time.Second); err != nil || string(out) != "stayed" {
		t.Fatalf("after a failed Rebind: %q, %v", out, err)
	}
}

// TestUDPSegmented: a burst sent as one segmented send (UDP_SEGMENT) is
// answered message by message; the replies, coalesced or not, carry each
// request's seq and payload.
func TestUDPSegmented(t *testing.T) {
	_, addr, cred := udpAppliance(t, roles.Spec{Name: "echo"})
	ctx := context.Background()
	c, err := DialUDP(ctx, addr, cred, "echo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gro := EnableGRO(c.c)
	const n, size = 32, 64
	var burst []byte
	for i := range n {
		burst = AppendUDP(burst, UDPHeader{Op: UDPReq, Seq: uint32(100 + i), Session: c.session}, bytes.Repeat([]byte{byte(i)}, size))
	}
	oob := SegmentOOB(nil, UDPHeaderSize+size)
	if _, _, err := c.c.WriteMsgUDP(burst, oob, nil); err != nil {
		t.Skipf("no UDP segmentation offload here: %v", err)
	}
	got := map[uint32]bool{}
	buf, ob := make([]byte, 65536), make([]byte, 64)
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(got) < n {
		k, nn, _, _, err := c.c.ReadMsgUDP(buf, ob)
		if err != nil {
			t.Fatalf("%d of %d answered: %v", len(got), n, err)
		}
		seg := 0
		if gro {
			seg = GROSize(ob[:nn])
		}
		SplitGRO(buf[:k], seg, func(d []byte) {
			h, p, err := DecodeUDP(d)
			if err != nil || h.Op != UDPResp || h.Seq < 100 || h.Seq >= 100+n {
				t.Fatalf("reply %+v: %v", h, err)
			}
			if !bytes.Equal(p, bytes.Repeat([]byte{byte(h.Seq - 100)}, size)) {
				t.Fatalf("reply %d carries %x", h.Seq, p)
			}
			got[h.Seq] = true
		})
	}
}
