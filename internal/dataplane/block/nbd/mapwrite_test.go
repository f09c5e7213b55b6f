package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"testing"
)

// mappedTransports are the connections whose large writes to a tmpfs file
// go straight into its mapping: over TLS (decrypted into it) and on a
// plain socket (read(2) into it, in place of splice).
var mappedTransports = []struct {
	name string
	tls  bool
}{{"tls", true}, {"plain", false}}

// serveMapped serves a sparse size-byte file on tmpfs over TLS or plain
// TCP and returns its path, the server's address and the client's dial
// options; it skips the test where /dev/shm is not a tmpfs.
func serveMapped(t *testing.T, useTLS bool, size int64) (path, addr string, opts []DialOption) {
	t.Helper()
	path, b := sparseFile(t, fastDir(t), size)
	if !memoryBacked(t, path) {
		t.Skip("no tmpfs at /dev/shm")
	}
	addr, opts = serveExport(t, useTLS, Export{Name: testName, Backend: b})
	return path, addr, opts
}

// serveExport serves ex until the test ends, over TLS (a test PKI's) or
// plain TCP, and returns the address and the client's dial options.
func serveExport(t *testing.T, useTLS bool, ex Export) (addr string, opts []DialOption) {
	t.Helper()
	s := &Server{}
	if useTLS {
		pk := newTestPKI(t)
		s.TLSConfig = pk.server
		opts = append(opts, WithTLS(pk.clientConfig()))
	}
	if err := s.AddExport(ex); err != nil {
		t.Fatal(err)
	}
	return serveOn(t, s), opts
}

// TestMappedWrite: a write to a tmpfs file is read (over TLS, decrypted)
// straight into the file's mapping (one whose payload the reader's buffer
// already holds, as a 4 KiB one may, is written from there); the bytes are
// in the file, around them nothing changed, and a read returns them.
func TestMappedWrite(t *testing.T) {
	for _, tr := range mappedTransports {
		t.Run(tr.name, func(t *testing.T) {
			path, addr, opts := serveMapped(t, tr.tls, 4<<20)
			c := dial(t, addr, testName, opts...)
			for _, tc := range []struct {
				off, n int
				mapped bool
			}{{0, 4096, false}, {12345, 300 << 10, true}, {4<<20 - 1<<20, 1 << 20, true}} {
				p := make([]byte, tc.n)
				rand.Read(p)
				m0 := mappedWrites.Load()
				if _, err := c.WriteAt(p, int64(tc.off)); err != nil {
					t.Fatal(err)
				}
				if tc.mapped && mappedWrites.Load() == m0 {
					t.Errorf("write [%d,+%d) was not read into the mapping", tc.off, tc.n)
				}
				f, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(f[tc.off:tc.off+tc.n], p) {
					t.Fatalf("write [%d,+%d): the file does not hold it", tc.off, tc.n)
				}
				got := make([]byte, tc.n)
				r0 := mappedReads.Load()
				if _, err := c.ReadAt(got, int64(tc.off)); err != nil || !bytes.Equal(got, p) {
					t.Fatalf("read back [%d,+%d): %v", tc.off, tc.n, err)
				}
				// On a plain socket a read of data, large or small, is
				// answered from the mapping (over TLS it is encrypted
				// from a buffer).
				if !tr.tls && mappedReads.Load() == r0 {
					t.Errorf("read [%d,+%d) was not answered from the mapping", tc.off, tc.n)
				}
			}
			if f, _ := os.ReadFile(path); len(f) != 4<<20 || !bytes.Equal(f[4096:12345], make([]byte, 12345-4096)) {
				t.Fatal("bytes outside the writes changed")
			}
		})
	}
}

// TestMappedWriteTruncated: a file truncated under the mapping, in the
// middle of a write's range, makes the store into it fail past the file's
// new end (a fault over TLS, EFAULT from read(2) on a plain socket). The
// process does not fault: the payload's first bytes are in the mapping,
// the rest is written with pwrite, which grows the file again as a write
// of it would, not a byte lost or shifted; the write is answered, the
// connection serves on, and the server serves the next one.
func TestMappedWriteTruncated(t *testing.T) {
	for _, tr := range mappedTransports {
		t.Run(tr.name, func(t *testing.T) {
			path, addr, opts := serveMapped(t, tr.tls, 4<<20)
			c := dial(t, addr, testName, opts...)
			first := make([]byte, 256<<10)
			rand.Read(first)
			if _, err := c.WriteAt(first, 1<<20); err != nil {
				t.Fatal(err)
			}
			// At a page boundary inside the next write's range: the
			// pages before it are the file's.
			const cut = 2<<20 + 96<<10
			if err := os.Truncate(path, cut); err != nil {
				t.Fatal(err)
			}
			p := make([]byte, 256<<10)
			rand.Read(p)
			m0 := mappedWrites.Load()
			if _, err := c.WriteAt(p, 2<<20); err != nil {
				t.Fatalf("a write into a truncated file's mapping: %v", err)
			}
			if mappedWrites.Load() != m0 {
				t.Fatal("a write the mapping did not take was counted as mapped")
			}
			f, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]byte, 2<<20+len(p))
			copy(want[1<<20:], first)
			copy(want[2<<20:], p)
			if !bytes.Equal(f, want) {
				t.Fatalf("the file after the write (%d bytes) does not hold it", len(f))
			}
			got := make([]byte, len(p))
			if _, err := c.ReadAt(got, 2<<20); err != nil || !bytes.Equal(got, p) {
				t.Fatalf("read back on the same connection: %v", err)
			}
			c2 := dial(t, addr, testName, opts...)
			if _, err := c2.ReadAt(make([]byte, 4096), 0); err != nil {
				t.Fatalf("the next connection: %v", err)
			}
		})
	}
}

// TestMappedWriteOnlyWhereAllowed: the writes the mapping must not take
// go their ordinary ways, though their file is on tmpfs and their payload
// large: a rate-limited export's (the limit waits before the write), a
// FUA write (it syncs), and writes refused before their payload is read
// (a read-only export's: EPERM; one reaching past the end: ENOSPC), whose
// payload is consumed and never lands; the connection serves on.
func TestMappedWriteOnlyWhereAllowed(t *testing.T) {
	const size = 4 << 20
	for _, tr := range mappedTransports {
		for _, tc := range []struct {
			name  string
			ex    Export
			fua   bool
			off   uint64
			errno uint32
		}{
			{name: "rate limited", ex: Export{Limit: &RateLimit{BytesPerSec: 1 << 40}}},
			{name: "FUA", fua: true},
			{name: "read-only", ex: Export{ReadOnly: true}, errno: EPERM},
			{name: "past the end", off: size - 64<<10, errno: ENOSPC},
		} {
			t.Run(tr.name+"/"+tc.name, func(t *testing.T) {
				path, b := sparseFile(t, fastDir(t), size)
				if !memoryBacked(t, path) {
					t.Skip("no tmpfs at /dev/shm")
				}
				ex := tc.ex
				ex.Name, ex.Backend = testName, b
				addr, opts := serveExport(t, tr.tls, ex)
				c := dial(t, addr, testName, opts...)
				p := make([]byte, 256<<10)
				rand.Read(p)
				var flags uint16
				if tc.fua {
					flags = CmdFlagFUA
				}
				m0 := mappedWrites.Load()
				err := c.do(context.Background(), CmdWrite, flags, tc.off, uint32(len(p)), p, nil)
				var ne *Error
				switch {
				case tc.errno == 0 && err != nil:
					t.Fatal(err)
				case tc.errno != 0 && (!errors.As(err, &ne) || ne.Errno != tc.errno):
					t.Fatalf("the write: %v, want errno %d", err, tc.errno)
				}
				if mappedWrites.Load() != m0 {
					t.Fatal("the write was read into the mapping")
				}
				f, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				want := make([]byte, size)
				if tc.errno == 0 {
					copy(want[tc.off:], p)
				}
				if !bytes.Equal(f, want) {
					t.Fatal("the file does not hold what the write's answer says")
				}
				if _, err := c.ReadAt(make([]byte, 4096), 0); err != nil {
					t.Fatalf("the connection after the write: %v", err)
				}
			})
		}
	}
}
