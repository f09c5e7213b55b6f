package nbd

import (
	"bytes"
	"crypto/rand"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

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
