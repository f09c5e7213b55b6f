package nbd

import (
	"bytes"
	"crypto/rand"
	"errors"
	"math"
	"os"
	"sync"
	"testing"
)

// TestFileMemoryWrites writes a partition (not page-aligned) of a tmpfs
// file from several goroutines at once: such writes are raw pwrite(2)
// calls and FLUSH makes no system call there (rawcall.go, FileBackend.Flush).
// The file must hold exactly the bytes written, at the partition's offsets,
// and nothing outside it; once closed, writes and flushes fail.
func TestFileMemoryWrites(t *testing.T) {
	const (
		size  = 4 << 20
		base  = 1<<20 + 512 // not a multiple of the page size
		plen  = 2 << 20
		chunk = 8 << 10
	)
	p := shmFile(t, size)
	b, err := OpenFile(p, FileOptions{Offset: base, Length: plen})
	if err != nil {
		t.Fatal(err)
	}
	if !b.memorySpeed() {
		t.Fatal("a file on tmpfs is not seen as memory")
	}
	want := make([]byte, plen)
	rand.Read(want)
	// Four writers, each a quarter of the chunks, interleaved over the
	// whole partition; every chunk is also written twice, the second
	// time with its final bytes.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			junk := make([]byte, chunk)
			for off := w * chunk; off < plen; off += 4 * chunk {
				if _, err := b.WriteAt(junk, int64(off)); err != nil {
					errs <- err
					return
				}
				if _, err := b.WriteAt(want[off:off+chunk], int64(off)); err != nil {
					errs <- err
					return
				}
				if err := b.Flush(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// An odd-sized write at the very end of the partition.
	tail := []byte("the last bytes")
	copy(want[plen-len(tail):], tail)
	if n, err := b.WriteAt(tail, plen-int64(len(tail))); err != nil || n != len(tail) {
		t.Fatalf("tail write: %d, %v", n, err)
	}
	if _, err := b.WriteAt(tail, plen-int64(len(tail))+1); err == nil {
		t.Fatal("a write past the partition succeeded")
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[base:base+plen], want) {
		t.Fatal("the partition does not hold the bytes written")
	}
	zero := make([]byte, size)
	if !bytes.Equal(got[:base], zero[:base]) || !bytes.Equal(got[base+plen:], zero[base+plen:]) {
		t.Fatal("bytes outside the partition changed")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); !errors.Is(err, ErrBackendClosed) {
		t.Fatalf("flush after close: %v, want ErrBackendClosed", err)
	}
	if _, err := b.WriteAt(tail, 0); !errors.Is(err, ErrBackendClosed) {
		t.Fatalf("write after close: %v, want ErrBackendClosed", err)
	}
}

// TestMemBackendRangeOverflow: a range whose end passes the int64 maximum
// is refused, not wrapped around into a panic on the slice bounds.
func TestMemBackendRangeOverflow(t *testing.T) {
	m := NewMemBackend(1 << 20)
	p := make([]byte, 16)
	for _, off := range []int64{math.MaxInt64 - 8, math.MaxInt64, 1<<20 - 8, 1 << 20} {
		if _, err := m.WriteAt(p, off); err == nil {
			t.Errorf("WriteAt(16 bytes, %d) succeeded", off)
		}
		if _, err := m.ReadAt(p, off); err == nil {
			t.Errorf("ReadAt(16 bytes, %d) succeeded", off)
		}
	}
	if _, err := m.WriteAt(p, 1<<20-16); err != nil {
		t.Fatalf("the last 16 bytes: %v", err)
	}
}
