package protocol

import (
	"bytes"
	"testing"
)

const testCred = "lease-cred-0123456789abcdef"

func seedFrames() [][]byte {
	var out [][]byte
	add := func(h Header, payload []byte) {
		b := make([]byte, HeaderSize, HeaderSize+len(payload))
		h.Payload = uint32(len(payload))
		h.Encode(b)
		out = append(out, append(b, payload...))
	}
	hello := (&Hello{Kind: KindControl, Credential: testCred}).Encode(nil)
	add(Header{Op: OpHello, Seq: 1}, hello)
	add(Header{Op: OpHello, Seq: 1, Length: HelloReplyGenSize}, hello)
	add(Header{Op: OpHello, Seq: 1, Length: HelloReplyGenSize, Offset: 0x9e3779b97f4a7c15}, hello) // a move's source
	add(Header{Op: OpHello, Flags: FlagResponse, Seq: 1, Offset: 1 << 20, Length: MaxPayload},
		(&HelloReply{Session: 7, Queue: 1}).Encode(nil, false))
	add(Header{Op: OpHello, Flags: FlagResponse, Seq: 1, Offset: 1 << 20, Length: MaxPayload},
		(&HelloReply{Session: 7, Queue: 1, Generation: 0x9e3779b97f4a7c15}).Encode(nil, true))
	add(Header{Op: OpRead, Seq: 2, Offset: 100, Length: 64}, nil)
	add(Header{Op: OpWrite, Seq: 3, Offset: 4096, Length: 5}, []byte("hello"))
	add(Header{Op: OpPing, Seq: 4}, nil)
	add(Header{Op: OpCredit, Flags: FlagResponse, Offset: 1, Credits: 64}, nil)
	add(Header{Op: OpRead, Flags: FlagResponse, Status: StatusRange, Seq: 5}, []byte("memory: out of range"))
	add(Header{Op: OpRead, Flags: FlagResponse, Seq: 6, Length: 3}, []byte("abc"))
	return out
}

func FuzzDecodeHeader(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s[:HeaderSize])
	}
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		// A decoded header re-encodes to the same bytes.
		var out [HeaderSize]byte
		h.Encode(out[:])
		if !bytes.Equal(out[:], b[:HeaderSize]) {
			t.Fatalf("re-encoding differs: %x vs %x", out, b[:HeaderSize])
		}
		if h.Payload > MaxPayload {
			t.Fatal("payload bound not enforced")
		}
		// Only a HELLO request carries a move's generation.
		if g := MoveGeneration(h); g != 0 && (h.Op != OpHello || h.IsResponse() || g != h.Offset) {
			t.Fatalf("MoveGeneration of %+v is %#x", h, g)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	f.Add((&Hello{Kind: KindControl, Credential: "c"}).Encode(nil))
	f.Add((&Hello{Kind: KindQueue, Session: 9, Credential: testCred}).Encode(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.Encode(nil), b) {
			t.Fatal("hello does not round-trip")
		}
	})
}

func FuzzDecodeHelloReply(f *testing.F) {
	f.Add((&HelloReply{Session: 7, Queue: 1}).Encode(nil, false))
	f.Add((&HelloReply{Session: 7, Queue: 1, Generation: 0x9e3779b97f4a7c15}).Encode(nil, true))
	f.Add(make([]byte, HelloReplyGenSize))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeHelloReply(b)
		if err != nil {
			return
		}
		if got := m.Encode(nil, len(b) == HelloReplyGenSize); !bytes.Equal(got, b) {
			t.Fatalf("hello reply does not round-trip: %x vs %x", got, b)
		}
		if len(b) == HelloReplyGenSize && m.Generation == 0 {
			t.Fatal("a generation of 0 was accepted")
		}
	})
}
