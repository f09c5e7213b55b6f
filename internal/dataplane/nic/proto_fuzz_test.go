package nic

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []Header{{FrameData, 1500, 7}, {FrameCredit, 8, 0}, {FramePing, 8, 0}, {FrameError, 12, 0}, {9, 0, 0}} {
		var b [HeaderSize]byte
		h.Encode(b[:])
		f.Add(b[:])
	}
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error %v does not wrap ErrBadFrame", err)
			}
			return
		}
		var out [HeaderSize]byte
		h.Encode(out[:])
		if !bytes.Equal(out[:], b[:HeaderSize]) {
			t.Fatalf("re-encoded %x, got %x", out, b[:HeaderSize])
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	f.Add((&Hello{Conns: 1, Session: 1, Window: 1 << 20, MTU: 1500, Lease: LeaseID("secret")}).Encode(nil))
	f.Add((&Hello{Conns: 4, Index: 3, Session: 99, Window: 65536, MTU: 9000, Addr: netip.MustParseAddr("100.64.0.9"), Lease: LeaseID("x")}).Encode(nil))
	f.Add([]byte("RNIC"))
	v1 := (&Hello{Conns: 1, Session: 1, Window: 1 << 20, MTU: 1500}).Encode(nil)
	v1[4] = 1 // a version 1 HELLO's first bytes
	f.Add(v1)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHello(b)
		r, rerr := ReadHello(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			if rerr == nil && len(b) == HelloSize {
				t.Fatalf("ReadHello took %x, DecodeHello refused it: %v", b, err)
			}
			return
		}
		if h.Index >= h.Conns || h.MTU < MinMTU || h.Session == 0 {
			t.Fatalf("accepted %+v", h)
		}
		if got := h.Encode(nil); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, got %x", got, b)
		}
		if rerr != nil || r != h {
			t.Fatalf("ReadHello: %+v, %v; DecodeHello: %+v", r, rerr, h)
		}
	})
}

func FuzzDecodeChallenge(f *testing.F) {
	f.Add(EncodeChallenge(nil, [ChallengeSize]byte{1, 2, 3}))
	f.Add((&Welcome{Status: StatusAuth, Message: "no"}).Encode(nil))
	f.Add((&Welcome{Status: StatusVersion}).Encode(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeChallenge(b)
		rc, refused, rerr := ReadChallenge(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			if refused != nil && refused.Status == StatusOK {
				t.Fatalf("a refusal with StatusOK: %+v", refused)
			}
			return
		}
		if got := EncodeChallenge(nil, c); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, got %x", got, b)
		}
		if rerr != nil || refused != nil || rc != c {
			t.Fatalf("ReadChallenge: %x, %+v, %v; DecodeChallenge: %x", rc, refused, rerr, c)
		}
	})
}

func FuzzDecodeWelcome(f *testing.F) {
	f.Add((&Welcome{Status: StatusOK, MTU: 1500, Window: 1 << 19, Addr: netip.MustParseAddr("100.64.1.2"), Rate: 1e8,
		Routes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("0.0.0.0/0")}}).Encode(nil))
	f.Add((&Welcome{Status: StatusAuth, Message: "no"}).Encode(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := DecodeWelcome(b)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		for _, p := range w.Routes {
			if p != p.Masked() {
				t.Fatalf("route %v has host bits", p)
			}
		}
		r, err := ReadWelcome(bytes.NewReader(b))
		if err != nil || r.Addr != w.Addr || len(r.Routes) != len(w.Routes) || r.Message != w.Message {
			t.Fatalf("ReadWelcome: %+v, %v; DecodeWelcome: %+v", r, err, w)
		}
	})
}
