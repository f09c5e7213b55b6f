package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func tempFile(t testing.TB, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

func TestFileBackendOpen(t *testing.T) {
	p := tempFile(t, 4<<20+100)
	cases := []struct {
		name string
		o    FileOptions
		size int64
		err  bool
	}{
		{"whole file rounded to 512", FileOptions{}, 4 << 20, false},
		{"partition", FileOptions{Offset: 1 << 20, Length: 1 << 20}, 1 << 20, false},
		{"partition to end", FileOptions{Offset: 4 << 20}, 0, true}, // 100 bytes < 512
		{"partition beyond end", FileOptions{Offset: 4 << 20, Length: 1 << 20}, 0, true},
		{"negative offset", FileOptions{Offset: -1}, 0, true},
		{"read-only", FileOptions{ReadOnly: true}, 4 << 20, false},
	}
	for _, tc := range cases {
		b, err := OpenFile(p, tc.o)
		if (err != nil) != tc.err {
			t.Errorf("%s: err %v", tc.name, err)
			continue
		}
		if err == nil {
			if b.Size() != tc.size {
				t.Errorf("%s: size %d, want %d", tc.name, b.Size(), tc.size)
			}
			b.Close()
		}
	}
	if _, err := OpenFile(filepath.Join(t.TempDir(), "missing"), FileOptions{}); err == nil {
		t.Error("opened a missing file")
	}
}

func TestFileBackendPartition(t *testing.T) {
	p := tempFile(t, 4<<20)
	b, err := OpenFile(p, FileOptions{Offset: 1 << 20, Length: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// A fresh sparse file is one hole.
	if ex, _ := b.Extents(0, 2<<20); len(ex) != 1 || ex[0].Flags != StateHole|StateZero || ex[0].Length != 2<<20 {
		t.Fatalf("fresh extents %+v", ex)
	}
	data := make([]byte, 128<<10)
	rand.Read(data)
	if _, err := b.WriteAt(data, 256<<10); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAtFUA(data[:4096], 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	// The write landed at partition offset + 1 MiB in the file.
	raw, _ := os.ReadFile(p)
	if !bytes.Equal(raw[1<<20+256<<10:1<<20+384<<10], data) || !bytes.Equal(raw[1<<20:1<<20+4096], data[:4096]) {
		t.Fatal("partition offset not applied")
	}
	if !bytes.Equal(raw[:1<<20], make([]byte, 1<<20)) {
		t.Fatal("write escaped the partition")
	}
	ex, _ := b.Extents(0, 2<<20)
	want := []Extent{{64 << 10, 0}, {192 << 10, StateHole | StateZero}, {128 << 10, 0}, {2<<20 - 384<<10, StateHole | StateZero}}
	if len(ex) != len(want) {
		t.Fatalf("extents %+v, want %+v", ex, want)
	}
	for i := range ex {
		if ex[i] != want[i] {
			t.Fatalf("extents %+v, want %+v", ex, want)
		}
	}
	// Out of range.
	if _, err := b.WriteAt(data, 2<<20-4096); err == nil {
		t.Fatal("write beyond the partition")
	}
	if n, err := b.ReadAt(make([]byte, 8192), 2<<20-4096); n != 4096 || err == nil {
		t.Fatalf("read at end: %d %v", n, err)
	}
	// Trim and zeroes read back as zeroes.
	if err := b.Trim(256<<10, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteZeroes(320<<10, 32<<10, false); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteZeroes(352<<10, 32<<10, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 128<<10)
	b.ReadAt(got, 256<<10)
	if !bytes.Equal(got, make([]byte, 128<<10)) {
		t.Fatal("trimmed/zeroed range not zero")
	}
	if err := b.Trim(2<<20, 512); err == nil {
		t.Fatal("trim beyond the partition")
	}
}

func TestFileBackendExistingData(t *testing.T) {
	p := tempFile(t, 8<<20)
	f, _ := os.OpenFile(p, os.O_RDWR, 0)
	f.WriteAt(bytes.Repeat([]byte{1}, 1<<20), 3<<20)
	f.Close()
	b, err := OpenFile(p, FileOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ex, _ := b.Extents(0, 8<<20)
	// Data must never be reported as a hole.
	pos := int64(0)
	for _, e := range ex {
		if e.Flags != 0 && pos < 4<<20 && pos+e.Length > 3<<20 {
			t.Fatalf("data reported as hole: %+v", ex)
		}
		pos += e.Length
	}
	if pos != 8<<20 {
		t.Fatalf("extents cover %d", pos)
	}
	if _, err := b.WriteAt([]byte{1}, 0); err == nil {
		t.Fatal("wrote to a read-only backend")
	}
	var perr *Error
	_ = errors.As(err, &perr)
}

func TestFileExportMultiConn(t *testing.T) {
	p := tempFile(t, 4<<20)
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, addr := startServer(t, Export{Name: testName, Backend: b})
	c1 := dial(t, addr, testName)
	c2 := dial(t, addr, testName)
	if c1.Flags()&FlagCanMultiConn == 0 {
		t.Fatal("file export lacks CAN_MULTI_CONN")
	}
	data := make([]byte, 1<<20)
	rand.Read(data)
	if _, err := c1.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := c2.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := c2.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatal("second connection does not see the first's write", err)
	}
}

// TestFilePartitionExportSendfile reads large ranges (served with sendfile)
// and small ones (pread) from a partition export and checks the offsets.
func TestFilePartitionExportSendfile(t *testing.T) {
	p := tempFile(t, 8<<20)
	whole := make([]byte, 8<<20)
	rand.Read(whole)
	if err := os.WriteFile(p, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := OpenFile(p, FileOptions{Offset: 3 << 20, Length: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, addr := startServer(t, Export{Name: testName, Backend: b, MaxBlock: 1 << 20})
	for _, structured := range []bool{true, false} {
		var opts []DialOption
		if !structured {
			opts = append(opts, WithoutStructuredReplies())
		}
		c := dial(t, addr, testName, opts...)
		for _, r := range []struct{ off, n int64 }{{0, 4 << 20}, {512, 4096}, {1<<20 + 4096, 200 << 10}, {4<<20 - 64<<10, 64 << 10}} {
			got := make([]byte, r.n)
			if _, err := c.ReadAt(got, r.off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, whole[3<<20+r.off:3<<20+r.off+r.n]) {
				t.Fatalf("structured=%v read [%d,+%d) wrong", structured, r.off, r.n)
			}
		}
	}
	// Large writes are spliced from the socket into the file, small ones
	// are buffered; both must land at the partition offset.
	c := dial(t, addr, testName)
	for _, w := range []struct{ off, n int64 }{{4096, 300 << 10}, {1 << 20, 4096}, {2 << 20, 1 << 20}} {
		p := make([]byte, w.n)
		rand.Read(p)
		copy(whole[3<<20+w.off:], p)
		if _, err := c.WriteAtContext(context.Background(), p, w.off, w.n == 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	if !bytes.Equal(raw, whole) {
		t.Fatal("spliced writes did not land where expected")
	}
	var ne *Error
	if err := c.do(context.Background(), CmdWrite, 0, 4<<20-64<<10, 128<<10, make([]byte, 128<<10), nil); !errors.As(err, &ne) || ne.Errno != ENOSPC {
		t.Fatalf("write beyond the partition: %v", err)
	}
	if _, err := c.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal("connection broken after a rejected large write:", err)
	}
}

// TestFileExportClientVanishes drops clients in the middle of a spliced write
// payload and of a sendfile read reply; other clients must not notice.
func TestFileExportClientVanishes(t *testing.T) {
	p := tempFile(t, 64<<20)
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, addr := startServer(t, Export{Name: testName, Backend: b})
	other := dial(t, addr, testName)
	data := make([]byte, 1<<20)
	rand.Read(data)
	if _, err := other.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}

	// Mid-payload of a 4 MiB write (spliced).
	rc := rawDial(t, addr, 3)
	rc.goTransmission(testName, true, false)
	hdr := make([]byte, requestHeaderLen)
	putRequest(hdr, Request{Type: CmdWrite, Handle: 1, Offset: 8 << 20, Length: 4 << 20})
	rc.write(append(hdr, make([]byte, 300<<10)...))
	rc.c.Close()

	// Mid-reply of a 32 MiB read (sendfile): ask, read a little, vanish.
	rc2 := rawDial(t, addr, 3)
	rc2.goTransmission(testName, true, false)
	rc2.request(Request{Type: CmdRead, Handle: 2, Length: 32 << 20}, nil)
	if _, err := ioReadFull(rc2, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	rc2.c.Close()

	got := make([]byte, len(data))
	if _, err := other.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("other client affected: %v", err)
	}
	if _, err := other.WriteAt(data[:128<<10], 16<<20); err != nil {
		t.Fatalf("other client cannot write: %v", err)
	}
}
