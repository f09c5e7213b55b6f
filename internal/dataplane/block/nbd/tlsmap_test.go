package nbd

import (
	"bytes"
	"crypto/rand"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTLSMappedWrite: over TLS a write to a tmpfs file is decrypted
// straight into the file's mapping (one whose payload the reader's buffer
// already holds, as a 4 KiB one may, is written from there); the bytes are
// in the file, around them nothing changed, and a read returns them.
func TestTLSMappedWrite(t *testing.T) {
	pk := newTestPKI(t)
	path, addr, _ := serveFileTLS(t, pk, fastDir(t), 4<<20)
	c := dial(t, addr, testName, WithTLS(pk.clientConfig()))
	for _, tc := range []struct {
		off, n int
		mapped bool
	}{{0, 4096, false}, {12345, 300 << 10, true}, {4<<20 - 1<<20, 1 << 20, true}} {
		p := make([]byte, tc.n)
		rand.Read(p)
		m0 := tlsMappedWrites.Load()
		if _, err := c.WriteAt(p, int64(tc.off)); err != nil {
			t.Fatal(err)
		}
		if tc.mapped && tlsMappedWrites.Load() == m0 {
			t.Errorf("write [%d,+%d) was not decrypted into the mapping", tc.off, tc.n)
		}
		f, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(f[tc.off:tc.off+tc.n], p) {
			t.Fatalf("write [%d,+%d): the file does not hold it", tc.off, tc.n)
		}
		got := make([]byte, tc.n)
		if _, err := c.ReadAt(got, int64(tc.off)); err != nil || !bytes.Equal(got, p) {
			t.Fatalf("read back [%d,+%d): %v", tc.off, tc.n, err)
		}
	}
	if f, _ := os.ReadFile(path); len(f) != 4<<20 || !bytes.Equal(f[4096:12345], make([]byte, 12345-4096)) {
		t.Fatal("bytes outside the writes changed")
	}
}

// TestTLSMappedWriteTruncated: a file truncated under the mapping makes
// the write fault; the connection ends with an error, the process does not,
// and the server serves the next connection.
func TestTLSMappedWriteTruncated(t *testing.T) {
	pk := newTestPKI(t)
	path, addr, _ := serveFileTLS(t, pk, fastDir(t), 4<<20)
	c := dial(t, addr, testName, WithTLS(pk.clientConfig()))
	p := make([]byte, 256<<10)
	rand.Read(p)
	if _, err := c.WriteAt(p, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	m0 := tlsMappedWrites.Load()
	_, err := c.WriteAt(p, 2<<20)
	if err == nil {
		t.Fatal("a write into a truncated file's mapping succeeded")
	}
	if tlsMappedWrites.Load() != m0 {
		t.Fatal("a faulted write was counted as written")
	}
	t.Logf("the write failed: %v", err)
	c2 := dial(t, addr, testName, WithTLS(pk.clientConfig()))
	if _, err := c2.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("the next connection: %v", err)
	}
}

// TestTLSPooledWrite: a write over TLS that the file's mapping cannot take
// (here the tmpfs file is shorter than the export, so a store into the
// mapping past its end would fault) is decrypted into a pooled buffer and
// written by the reader with pwrite, which extends the file; the bytes are
// there and read back.
func TestTLSPooledWrite(t *testing.T) {
	pk := newTestPKI(t)
	path, addr, _ := serveFileTLS(t, pk, fastDir(t), 4<<20)
	if err := os.Truncate(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	c := dial(t, addr, testName, WithTLS(pk.clientConfig()))
	p := make([]byte, 256<<10)
	rand.Read(p)
	m0, r0 := tlsMappedWrites.Load(), tlsReaderWrites.Load()
	if _, err := c.WriteAt(p, 2<<20); err != nil {
		t.Fatal(err)
	}
	if tlsMappedWrites.Load() != m0 {
		t.Fatal("a write past the file's end went into the mapping")
	}
	if memoryBacked(t, path) && tlsReaderWrites.Load() == r0 {
		t.Fatal("the write was not served by the reader from its pooled buffer")
	}
	f, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 2<<20+len(p) || !bytes.Equal(f[2<<20:], p) {
		t.Fatalf("the file (%d bytes) does not hold the write", len(f))
	}
	got := make([]byte, len(p))
	if _, err := c.ReadAt(got, 2<<20); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read back: %v", err)
	}
}

// memoryBacked reports whether path is on tmpfs or ramfs, where the server
// serves writes at memory speed (from the reader, mapped or pooled).
func memoryBacked(t *testing.T, path string) bool {
	t.Helper()
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		t.Fatal(err)
	}
	return sfs.Type == unix.TMPFS_MAGIC || sfs.Type == unix.RAMFS_MAGIC
}
