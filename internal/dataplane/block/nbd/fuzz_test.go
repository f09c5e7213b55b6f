package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// fakeConn feeds fixed client bytes to the server and discards its output.
type fakeConn struct {
	r io.Reader
}

func (f *fakeConn) Read(p []byte) (int, error)       { return f.r.Read(p) }
func (f *fakeConn) Write(p []byte) (int, error)      { return len(p), nil }
func (f *fakeConn) Close() error                     { return nil }
func (f *fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (f *fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (f *fakeConn) SetDeadline(time.Time) error      { return nil }
func (f *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (f *fakeConn) SetWriteDeadline(time.Time) error { return nil }

func optBytes(opt uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, optMagic)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

func FuzzHandshake(f *testing.F) {
	flags := []byte{0, 0, 0, 3}
	seed := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{flags}, parts...), nil) }
	f.Add(seed(optBytes(optGo, infoData(testName, infoBlockSize))))
	f.Add(seed(optBytes(optStructuredReply, nil), optBytes(optSetMetaContext, metaData(testName, MetaContextBaseAllocation)),
		optBytes(optInfo, infoData(testName, infoDescription, infoBlockSize)), optBytes(optGo, infoData(testName))))
	f.Add(seed(optBytes(optList, nil), optBytes(optAbort, nil)))
	f.Add(seed(optBytes(optStructuredReply, nil), optBytes(optListMetaContext, metaData(testName, "base:"))))
	f.Add(seed(optBytes(optExportName, []byte(testName))))
	f.Add(seed(optBytes(optInfo, []byte{0, 0, 0, 9, 1})))
	f.Add([]byte{0, 0, 0, 1, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		s := &Server{}
		s.AddExport(Export{Name: testName, Description: "d", Backend: NewMemBackend(1 << 16)})
		sess, err := s.negotiate(&fakeConn{r: bytes.NewReader(nil)}, newConnReader(bytes.NewReader(in)))
		if err == nil && (sess == nil || sess.exp == nil || sess.name != testName) {
			t.Fatalf("success without a valid session: %+v", sess)
		}
	})
}

func reqBytes(r Request, payload int) []byte {
	b := make([]byte, requestHeaderLen+payload)
	putRequest(b, r)
	return b
}

func FuzzRequest(f *testing.F) {
	f.Add(byte(3), reqBytes(Request{Type: CmdRead, Length: 4096}, 0))
	f.Add(byte(1), append(reqBytes(Request{Type: CmdWrite, Flags: CmdFlagFUA, Offset: 512, Length: 512}, 512),
		reqBytes(Request{Type: CmdFlush}, 0)...))
	f.Add(byte(3), bytes.Join([][]byte{
		reqBytes(Request{Type: CmdBlockStatus, Flags: CmdFlagReqOne, Length: 1 << 16}, 0),
		reqBytes(Request{Type: CmdTrim, Length: 4096}, 0),
		reqBytes(Request{Type: CmdWriteZeroes, Flags: CmdFlagNoHole, Length: 8192}, 0),
		reqBytes(Request{Type: CmdRead, Offset: 1 << 40, Length: 1}, 0),
		reqBytes(Request{Type: CmdDisc}, 0)}, nil))
	f.Add(byte(0), reqBytes(Request{Type: CmdWrite, Length: 1 << 30}, 100))
	f.Add(byte(2), []byte{0x25, 0x60, 0x95, 0x13, 0, 0})
	f.Fuzz(func(t *testing.T, mode byte, in []byte) {
		s := &Server{Workers: 2}
		e := Export{Name: testName, Backend: NewMemBackend(1 << 16), ReadOnly: mode&4 != 0, MaxBlock: 1 << 16}
		if mode&8 != 0 {
			e.MinBlock = 512
		}
		s.AddExport(e)
		exp := s.lookup(testName)
		sess := &session{name: testName, exp: exp, structured: mode&1 != 0, meta: mode&2 != 0}
		nc := &fakeConn{r: bytes.NewReader(in)}
		c := newConn(s, nc, newConnReader(nc), sess)
		c.serve(context.Background())
		if len(in) >= requestHeaderLen {
			r, err := parseRequest(in)
			if err == nil {
				b := make([]byte, requestHeaderLen)
				putRequest(b, r)
				if !bytes.Equal(b, in[:requestHeaderLen]) {
					t.Fatal("request header does not round-trip")
				}
			}
		}
	})
}

func chunkBytes(flags, typ uint16, handle uint64, payload []byte) []byte {
	b := make([]byte, structuredHeaderLen, structuredHeaderLen+len(payload))
	putChunkHeader(b, flags, typ, handle, uint32(len(payload)))
	return append(b, payload...)
}

// FuzzClientReply feeds arbitrary server bytes to the client's reply
// parser with a read, a block-status and a write request pending.
func FuzzClientReply(f *testing.F) {
	simple := make([]byte, simpleReplyLen)
	putSimpleReply(simple, 0, 3)
	bs := binary.BigEndian.AppendUint32(nil, 1)
	bs = binary.BigEndian.AppendUint32(bs, 4096)
	bs = binary.BigEndian.AppendUint32(bs, StateHole|StateZero)
	f.Add(bytes.Join([][]byte{
		chunkBytes(replyFlagDone, replyTypeOffsetData, 1, append(make([]byte, 8), make([]byte, 4096)...)),
		chunkBytes(replyFlagDone, replyTypeBlockStatus, 2, bs),
		simple}, nil))
	f.Add(chunkBytes(replyFlagDone, replyTypeError, 2, []byte{0, 0, 0, 5, 0, 2, 'h', 'i'}))
	f.Add(chunkBytes(0, replyTypeOffsetHole, 1, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0}))
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &Client{pending: map[uint64]*call{}, meta: true, metaID: 1, size: 1 << 20}
		c.pending[1] = &call{typ: CmdRead, buf: make([]byte, 4096), done: make(chan struct{})}
		c.pending[2] = &call{typ: CmdBlockStatus, done: make(chan struct{})}
		c.pending[3] = &call{typ: CmdWrite, done: make(chan struct{})}
		r := newConnReader(bytes.NewReader(in))
		for n := 0; ; n++ {
			if err := c.receiveOne(r); err != nil {
				break
			}
			if n > len(in) {
				t.Fatal("receiveOne kept returning without consuming input")
			}
		}
	})
}

func optReplyBytes(opt, typ uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, optReplyMagic)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// FuzzClientHandshake feeds arbitrary server bytes to the client's side of
// the handshake: it must fail or end with a usable export — a size that is
// not negative and block sizes the client can split requests by.
func FuzzClientHandshake(f *testing.F) {
	hello := binary.BigEndian.AppendUint64(nil, nbdMagic)
	hello = binary.BigEndian.AppendUint64(hello, optMagic)
	hello = binary.BigEndian.AppendUint16(hello, flagFixedNewstyle|flagNoZeroes)
	info := binary.BigEndian.AppendUint16(nil, infoExport)
	info = binary.BigEndian.AppendUint64(info, 1<<20)
	info = binary.BigEndian.AppendUint16(info, FlagHasFlags|FlagSendFlush)
	bs := binary.BigEndian.AppendUint16(nil, infoBlockSize)
	bs = binary.BigEndian.AppendUint32(bs, 512)
	bs = binary.BigEndian.AppendUint32(bs, 4096)
	bs = binary.BigEndian.AppendUint32(bs, 1<<20)
	meta := append(binary.BigEndian.AppendUint32(nil, metaContextID), MetaContextBaseAllocation...)
	goReplies := bytes.Join([][]byte{optReplyBytes(optGo, repInfo, info), optReplyBytes(optGo, repInfo, bs),
		optReplyBytes(optGo, repAck, nil)}, nil)
	f.Add(true, bytes.Join([][]byte{hello, optReplyBytes(optStructuredReply, repAck, nil),
		optReplyBytes(optSetMetaContext, repMetaContext, meta), optReplyBytes(optSetMetaContext, repAck, nil), goReplies}, nil))
	f.Add(false, append(append([]byte(nil), hello...), goReplies...))
	export := binary.BigEndian.AppendUint64(nil, 1<<30)
	export = binary.BigEndian.AppendUint16(export, FlagHasFlags)
	f.Add(false, bytes.Join([][]byte{hello, optReplyBytes(optGo, repErrUnsup, nil), export}, nil))
	f.Add(false, bytes.Join([][]byte{hello, optReplyBytes(optGo, repErrPolicy, []byte("no"))}, nil))
	f.Fuzz(func(t *testing.T, structured bool, in []byte) {
		c := newClient(&fakeConn{r: bytes.NewReader(nil)}, 0)
		if _, err := c.handshake(newConnReader(bytes.NewReader(in)), testName, structured, nil); err != nil {
			return
		}
		mn, _, mx := c.BlockSizes()
		if c.Size() < 0 {
			t.Fatalf("export size %d", c.Size())
		}
		if !isPow2(mn) || mx < mn || mx%mn != 0 {
			t.Fatalf("block sizes min %d max %d", mn, mx)
		}
	})
}

// FuzzParseMetaRequest: parseMetaRequest never panics, and what it
// accepts is exactly the encoding of what it returns (nothing left over,
// nothing read past the data).
func FuzzParseMetaRequest(f *testing.F) {
	f.Add(metaData(testName, MetaContextBaseAllocation))
	f.Add(metaData(testName))
	f.Add(metaData("", "base:", "qemu:dirty-bitmap:b"))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9})
	f.Add([]byte{0xff, 0xff, 0xff, 0xf8, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, d []byte) {
		name, queries, ok := parseMetaRequest(d)
		if !ok {
			return
		}
		if enc := metaData(name, queries...); !bytes.Equal(enc, d) {
			t.Fatalf("parsed %q %q from %x, which encode as %x", name, queries, d, enc)
		}
	})
}
