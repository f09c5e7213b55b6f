package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"os"
	"testing"
)

// TestFileRangesStayInside: the ranges a FileBackend hands out for the
// data paths that bypass pread and pwrite (a writable mapping, splice's
// destination, a read-only mapping, sendfile's source) are refused
// whenever any byte of them lies outside the partition, an end that
// overflows int64 too: the server checks a request's range first, and
// these checks must hold without it (a mapped write landing outside the
// partition would write into the next lease of the file).
func TestFileRangesStayInside(t *testing.T) {
	const (
		size = 16 << 20
		base = 1<<20 + 1536 // not page-aligned
		plen = 6 << 20      // whole 2 MiB spans inside: sendfile's range
	)
	p := shmFile(t, size)
	b, err := OpenFile(p, FileOptions{Offset: base, Length: plen})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.mm == nil || !b.mm.writable {
		t.Skip("the tmpfs file is not mapped writable")
	}
	// Every chunk as data, so that mapRange looks at the range alone.
	b.alloc.mark(0, plen)
	type ranger struct {
		name string
		get  func(off, n int64) bool // ok; releases what it took
	}
	rangers := []ranger{
		{"mapWrite", func(off, n int64) bool {
			_, ok := b.mapWrite(off, n)
			if ok {
				b.unmapRange()
			}
			return ok
		}},
		{"mapRange", func(off, n int64) bool {
			_, ok := b.mapRange(off, n)
			if ok {
				b.unmapRange()
			}
			return ok
		}},
		{"spliceDest", func(off, n int64) bool {
			_, _, ok := b.spliceDest(off, n)
			if ok {
				b.releaseFD()
			}
			return ok
		}},
	}
	if zo, zn := b.ZeroCopyRange(); zn > 0 {
		rangers = append(rangers, ranger{"sendfileRange", func(off, n int64) bool {
			_, _, ok := b.sendfileRange(off+zo, n)
			if ok {
				b.releaseFD()
			}
			return ok
		}})
	}
	for _, r := range rangers {
		lim := int64(plen)
		if r.name == "sendfileRange" {
			_, lim = b.ZeroCopyRange()
		}
		for _, tc := range []struct {
			off, n int64
			ok     bool
		}{
			{0, 64 << 10, true},
			{lim - 64<<10, 64 << 10, true},
			{lim - 64<<10, 64<<10 + 512, false},
			{lim, 4096, false},
			{-4096, 8192, false},
			{0, 0, false},
			{math.MaxInt64 - 4095, 8192, false},
			{math.MaxInt64 - base + 4096, 1 << 20, false},
			{4096, math.MaxInt64 - 2048, false},
		} {
			t.Run(fmt.Sprintf("%s[%d,+%d)", r.name, tc.off, tc.n), func(t *testing.T) {
				defer func() {
					if e := recover(); e != nil {
						t.Fatalf("panic: %v", e)
					}
				}()
				if got := r.get(tc.off, tc.n); got != tc.ok {
					t.Fatalf("ok = %v, want %v", got, tc.ok)
				}
			})
		}
	}
	// Nothing outside the partition changed, nor inside it.
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, make([]byte, size)) {
		t.Fatal("the file changed")
	}
}

// TestPartitionMappedWrites: large writes to a partition (not
// page-aligned) of a tmpfs file, read straight into its mapping (over TLS,
// decrypted into it), land at the partition's offset, at its start and
// its very end too, and never touch a byte of the file around it; a
// write reaching past the partition's end is refused (ENOSPC) and the
// connection serves on.
func TestPartitionMappedWrites(t *testing.T) {
	const (
		size = 8 << 20
		base = 3<<20 + 1536
		plen = 2 << 20
	)
	for _, tr := range mappedTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := shmFile(t, size)
			fill := bytes.Repeat([]byte{0x5a}, size)
			if err := os.WriteFile(p, fill, 0o600); err != nil {
				t.Fatal(err)
			}
			b, err := OpenFile(p, FileOptions{Offset: base, Length: plen})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			addr, opts := serveExport(t, tr.tls, Export{Name: testName, Backend: b})
			c := dial(t, addr, testName, opts...)
			want := bytes.Clone(fill)
			m0 := mappedWrites.Load()
			for _, w := range []struct{ off, n int64 }{{0, 256 << 10}, {512 << 10, 64 << 10}, {plen - 1<<20, 1 << 20}} {
				data := make([]byte, w.n)
				rand.Read(data)
				if _, err := c.WriteAt(data, w.off); err != nil {
					t.Fatal(err)
				}
				copy(want[base+w.off:], data)
			}
			if got := mappedWrites.Load() - m0; got != 3 {
				t.Errorf("%d of the 3 writes were read into the mapping", got)
			}
			var ne *Error
			err = c.do(context.Background(), CmdWrite, 0, plen-64<<10, 128<<10, make([]byte, 128<<10), nil)
			if !errors.As(err, &ne) || ne.Errno != ENOSPC {
				t.Fatalf("a write past the partition's end: %v, want ENOSPC", err)
			}
			if err := c.Flush(); err != nil {
				t.Fatalf("the connection after the refused write: %v", err)
			}
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(raw[:base], want[:base]) || !bytes.Equal(raw[base+plen:], want[base+plen:]) {
				t.Fatal("a write touched the file outside the partition")
			}
			if !bytes.Equal(raw, want) {
				t.Fatal("the writes did not land at the partition's offset")
			}
		})
	}
}
