package nbd

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// countingConn counts the writes that reach a socket.
type countingConn struct {
	net.Conn
	writes int
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes++
	return c.Conn.Write(p)
}

// TestReaderConnGather checks that records written while gathering leave
// in one write of the socket at flush, in order, that gathering writes
// once it holds gatherMax bytes, and that writes outside gathering pass
// straight through.
func TestReaderConnGather(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer s.Close()
		b, _ := io.ReadAll(s)
		got <- b
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc := &countingConn{Conn: nc}
	rc := &readerConn{Conn: cc}
	var want []byte
	write := func(n int) {
		t.Helper()
		p := bytes.Repeat([]byte{byte(len(want) / 7)}, n)
		if k, err := rc.Write(p); err != nil || k != n {
			t.Fatalf("write %d bytes: %d, %v", n, k, err)
		}
		want = append(want, p...)
	}
	write(10) // not gathering: straight through
	if cc.writes != 1 {
		t.Fatalf("%d socket writes outside gathering, want 1", cc.writes)
	}
	rc.gather()
	for i := 0; i < 5; i++ {
		write(4096 + 22)
	}
	if cc.writes != 1 {
		t.Fatalf("%d socket writes while gathering 5 records, want none yet", cc.writes-1)
	}
	if err := rc.flush(); err != nil {
		t.Fatal(err)
	}
	if cc.writes != 2 {
		t.Fatalf("%d socket writes for 5 gathered records, want 1", cc.writes-1)
	}
	rc.gather()
	for i := 0; i < 5; i++ {
		write(16<<10 + 22) // the fourth passes gatherMax
	}
	if cc.writes != 3 {
		t.Fatalf("%d socket writes for 4 records past gatherMax, want 1", cc.writes-2)
	}
	if err := rc.flush(); err != nil {
		t.Fatal(err)
	}
	rc.gather()
	write(gatherMax) // large, nothing held: straight through
	if cc.writes != 5 {
		t.Fatalf("%d socket writes, want 5", cc.writes)
	}
	if err := rc.flush(); err != nil || cc.writes != 5 {
		t.Fatalf("flush with nothing held: %v, %d socket writes, want 5", err, cc.writes)
	}
	nc.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer got %d bytes, not the %d written in order", len(b), len(want))
	}
}
