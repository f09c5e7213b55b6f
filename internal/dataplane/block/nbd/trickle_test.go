package nbd

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// trickle copies src to dst in segment-sized pieces with pauses, as a slow
// link delivers a large payload.
func trickle(dst io.Writer, src io.Reader) {
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		for i := 0; i < n; i += 1448 {
			if _, werr := dst.Write(buf[i:min(i+1448, n)]); werr != nil {
				return
			}
		}
		if n > 0 {
			time.Sleep(100 * time.Microsecond)
		}
		if err != nil {
			return
		}
	}
}

// trickleProxy forwards connections to addr, trickling both directions.
func trickleProxy(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { trickle(s, c); s.(*net.TCPConn).CloseWrite() }()
			go func() { trickle(c, s); c.(*net.TCPConn).CloseWrite() }()
		}
	}()
	return ln.Addr().String()
}

// TestLargePayloadsTrickling: large writes (spliced into a file on disk,
// read into a tmpfs file's mapping) and large reads whose bytes arrive a
// segment at a time are received whole: the raised SO_RCVLOWAT never waits
// for more than a payload still owes, and is back to normal for the small
// requests after them.
func TestLargePayloadsTrickling(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dir    func(*testing.T) string
		mapped bool
	}{{"disk", (*testing.T).TempDir, false}, {"tmpfs", fastDir, true}} {
		t.Run(tc.name, func(t *testing.T) { testLargePayloadsTrickling(t, tc.dir(t), tc.mapped) })
	}
}

func testLargePayloadsTrickling(t *testing.T, dir string, mapped bool) {
	path := filepath.Join(dir, "disk")
	if err := os.WriteFile(path, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	be, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	_, addr := startServer(t, Export{Name: testName, Backend: be})
	c := dial(t, trickleProxy(t, addr), testName)
	rng := rand.New(rand.NewPCG(7, 7))
	m0 := mappedWrites.Load()
	for i, n := range []int{256 << 10, 64 << 10, 4096, 512<<10 + 12345, 100 << 10} {
		data := make([]byte, n)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		off := int64(i) * (1 << 20) / 4
		if _, err := c.WriteAt(data, off); err != nil {
			t.Fatalf("write %d bytes: %v", n, err)
		}
		got := make([]byte, n)
		if _, err := c.ReadAt(got, off); err != nil {
			t.Fatalf("read %d bytes: %v", n, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%d bytes read back differ", n)
		}
		if err := c.Flush(); err != nil { // a small request after a large one
			t.Fatal(err)
		}
	}
	if mapped && memoryBacked(t, path) && mappedWrites.Load()-m0 < 4 {
		t.Errorf("%d of the 4 large writes were read into the mapping", mappedWrites.Load()-m0)
	}
	onDisk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(onDisk))
	if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, onDisk) {
		t.Fatalf("whole export read back differs from the file: %v", err)
	}
}
