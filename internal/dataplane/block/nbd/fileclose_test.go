package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// leakMark fills the files opened after a backend's Close to take its freed
// descriptor number: a reply containing it came from another file.
var leakMark = []byte("LEAK-OTHER-EXPORT!")

// patternFile writes a size-byte file whose every 8-byte word holds its own
// offset (tagged), and returns its path and contents.
func patternFile(t testing.TB, size int) (string, []byte) {
	t.Helper()
	return patternFileIn(t, t.TempDir(), size)
}

// patternFileIn is patternFile in dir.
func patternFileIn(t testing.TB, dir string, size int) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	for o := 0; o < size; o += 8 {
		binary.LittleEndian.PutUint64(data[o:], uint64(o)|0xD15C<<48)
	}
	p := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, data
}

// leakFile writes a size-byte file filled with leakMark.
func leakFile(t testing.TB, size int) string {
	t.Helper()
	data := bytes.Repeat(leakMark, size/len(leakMark)+1)[:size]
	p := filepath.Join(t.TempDir(), "other.img")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// grabFDs opens path up to max times, stopping once a descriptor numbered
// want is obtained, and reports whether it was. The files stay open until
// the test ends.
func grabFDs(t testing.TB, path string, want, max int) bool {
	t.Helper()
	for range max {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if int(f.Fd()) == want {
			return true
		}
	}
	return false
}

// waitClosed polls until b's file is closed.
func waitClosed(t testing.TB, b *FileBackend) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := b.f.Stat(); errors.Is(err, os.ErrClosed) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("backend file still open")
		}
		runtime.Gosched()
	}
}

// TestFileBackendClosed checks every operation after Close fails with
// ErrBackendClosed, and that a descriptor handed out for sendfile or splice
// stays open across Close until released.
func TestFileBackendClosed(t *testing.T) {
	p, data := patternFile(t, 1<<20)
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.f.Stat(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("file not closed by an idle Close: %v", err)
	}
	buf := make([]byte, 4096)
	ops := []struct {
		name string
		do   func() error
	}{
		{"ReadAt", func() error { _, err := b.ReadAt(buf, 0); return err }},
		{"WriteAt", func() error { _, err := b.WriteAt(buf, 0); return err }},
		{"WriteAtFUA", func() error { _, err := b.WriteAtFUA(buf, 0); return err }},
		{"Flush", b.Flush},
		{"Trim", func() error { return b.Trim(0, 4096) }},
		{"WriteZeroes", func() error { return b.WriteZeroes(0, 4096, false) }},
		{"WriteZeroes noHole", func() error { return b.WriteZeroes(0, 4096, true) }},
		{"Extents", func() error { _, err := b.Extents(0, 4096); return err }},
		{"Close again", b.Close},
	}
	for _, op := range ops {
		err := op.do()
		if !errors.Is(err, ErrBackendClosed) {
			t.Errorf("%s after Close: %v, want %v", op.name, err, ErrBackendClosed)
		}
	}
	if _, _, ok := b.sendfileRange(0, 64<<10); ok {
		t.Error("sendfileRange succeeded after Close")
	}
	if _, _, ok := b.spliceDest(0, 64<<10); ok {
		t.Error("spliceDest succeeded after Close")
	}
	if got := errnoOf(fmt.Errorf("x: %w", ErrBackendClosed)); got != ESHUTDOWN {
		t.Errorf("errno of a closed backend %d, want ESHUTDOWN", got)
	}

	holds := []struct {
		name string
		take func(b *FileBackend) (int, int64, bool)
	}{
		{"sendfile", func(b *FileBackend) (int, int64, bool) { return b.sendfileRange(4096, 64<<10) }},
		{"splice", func(b *FileBackend) (int, int64, bool) { return b.spliceDest(4096, 64<<10) }},
	}
	for _, h := range holds {
		t.Run(h.name+" hold", func(t *testing.T) {
			b, err := OpenFile(p, FileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h.name == "sendfile" {
				needZeroCopy(t, b)
			}
			fd, foff, ok := h.take(b)
			if !ok {
				t.Fatal("no descriptor handed out")
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := b.ReadAt(buf, 0); !errors.Is(err, ErrBackendClosed) {
				t.Fatalf("ReadAt after Close with a hold: %v", err)
			}
			if _, err := b.f.Stat(); err != nil {
				t.Fatalf("file closed under a hold: %v", err)
			}
			got := make([]byte, 4096)
			if n, err := unix.Pread(fd, got, foff); err != nil || n != len(got) || !bytes.Equal(got, data[4096:8192]) {
				t.Fatalf("held descriptor unusable after Close: %d %v", n, err)
			}
			b.releaseFD()
			if _, err := b.f.Stat(); !errors.Is(err, os.ErrClosed) {
				t.Fatalf("file not closed by the last release: %v", err)
			}
		})
	}
}

// servePatternFile serves a pattern file of size bytes as the test export
// and makes another file of the same size for reused descriptors to point
// at; it returns the pattern, the other file's path, the backend and the
// server's address.
func servePatternFile(t *testing.T, size int) ([]byte, string, *FileBackend, string) {
	t.Helper()
	p, data := patternFile(t, size)
	other := leakFile(t, size)
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	needZeroCopy(t, b)
	_, addr := startServer(t, Export{Name: testName, Backend: b})
	return data, other, b, addr
}

// TestFileCloseDuringSendfile closes a backend while a large read reply is
// being sent with sendfile and a reused descriptor number points at another
// file: the reply must carry the export's bytes only, and later requests
// must fail with ESHUTDOWN rather than reach the other file.
func TestFileCloseDuringSendfile(t *testing.T) {
	const size = 32 << 20
	data, other, b, addr := servePatternFile(t, size)
	oldFD := b.fd

	rc := rawDial(t, addr, 3)
	rc.startLargeRead(size)
	got := make([]byte, size)
	const head = 64 << 10
	if _, err := io.ReadFull(rc.r, got[:head]); err != nil {
		t.Fatal(err)
	}
	// The reply is now in the middle of sendfile.
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := b.f.Stat(); err != nil {
		t.Errorf("file closed while a reply was being sent from it: %v", err)
	}
	reused := grabFDs(t, other, oldFD, 64)
	if _, err := io.ReadFull(rc.r, got[head:]); err != nil {
		t.Fatalf("reply cut short after Close (fd reused: %v): %v", reused, err)
	}
	if i := bytes.Index(got, leakMark); i >= 0 {
		t.Fatalf("reply carries another file's bytes at %d (fd reused: %v)", i, reused)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("reply differs from the export's contents")
	}

	// The last use is gone: the file closes and its number can be reused.
	waitClosed(t, b)
	reused = grabFDs(t, other, oldFD, 256)
	t.Logf("descriptor %d reused by another file: %v", oldFD, reused)
	reqs := []struct {
		name    string
		r       Request
		payload []byte
	}{
		{"sendfile read", Request{Type: CmdRead, Offset: 1 << 20, Length: 1 << 20}, nil},
		{"small read", Request{Type: CmdRead, Offset: 8192, Length: 4096}, nil},
		{"write", Request{Type: CmdWrite, Offset: 0, Length: 4096}, make([]byte, 4096)},
		{"spliced write", Request{Type: CmdWrite, Offset: 0, Length: 128 << 10}, make([]byte, 128<<10)},
		{"flush", Request{Type: CmdFlush}, nil},
	}
	for i, q := range reqs {
		q.r.Handle = uint64(10 + i)
		rc.request(q.r, q.payload)
		rr, err := rc.reply(0)
		if err != nil {
			t.Fatalf("%s after Close: %v", q.name, err)
		}
		if bytes.Contains(rr.data, leakMark) {
			t.Fatalf("%s after Close returned another file's bytes", q.name)
		}
		if rr.handle != q.r.Handle || rr.errno != ESHUTDOWN {
			t.Errorf("%s after Close: handle %d errno %d, want %d ESHUTDOWN", q.name, rr.handle, rr.errno, q.r.Handle)
		}
	}
	// The writes above must not have reached the other file.
	raw, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(raw, leakMark) != size/len(leakMark) {
		t.Fatal("a write after Close reached the file on the reused descriptor")
	}
}

// TestFileCloseUnderLoad closes a backend while several clients read large
// ranges (sendfile) in parallel, then opens other files to take the freed
// descriptor number. Every read must return the export's bytes or fail.
func TestFileCloseUnderLoad(t *testing.T) {
	const (
		size    = 8 << 20
		clients = 4
		perStep = 16 // reads each client completes per phase
	)
	data, other, b, addr := servePatternFile(t, size)
	oldFD := b.fd

	var (
		closed atomic.Bool
		stop   atomic.Bool
		counts [clients]atomic.Int64
		fails  [clients]atomic.Int64
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []string
	)
	report := func(format string, a ...any) {
		mu.Lock()
		if len(errs) < 10 {
			errs = append(errs, fmt.Sprintf(format, a...))
		}
		mu.Unlock()
	}
	for i := range clients {
		c := dial(t, addr, testName)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { c.Close() }()
			buf := make([]byte, 1<<20)
			for k := 0; !stop.Load(); k++ {
				n := (64 << 10) * (1 + (k+i)%16) // 64 KiB .. 1 MiB
				off := int64((k*7919 + i*104729) % (size/512 - n/512) * 512)
				p := buf[:n]
				clear(p)
				_, err := c.ReadAt(p, off)
				wasClosed := closed.Load()
				if j := bytes.Index(p, leakMark); j >= 0 {
					report("client %d: read [%d,+%d) carries another file's bytes at %d (err %v)", i, off, n, j, err)
				} else if err == nil && !bytes.Equal(p, data[off:off+int64(n)]) {
					report("client %d: read [%d,+%d) wrong", i, off, n)
				} else if err != nil {
					// The first ESHUTDOWN reply ends the client's use of
					// the connection: later reads fail with ErrShutdown.
					switch {
					case !wasClosed:
						report("client %d: read failed before Close: %v", i, err)
					case !errors.Is(err, ErrShutdown):
						report("client %d: read after Close: %v, want ESHUTDOWN", i, err)
					default:
						// Dial again, so that every read still reaches
						// the server.
						c.Close()
						nc, derr := Dial(context.Background(), "tcp", addr, testName)
						if derr != nil {
							report("client %d: dial after ESHUTDOWN: %v", i, derr)
							return
						}
						c = nc
					}
					fails[i].Add(1)
				}
				counts[i].Add(1)
			}
		}()
	}
	waitAll := func(base [clients]int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for i := range clients {
			for counts[i].Load() < base[i]+perStep {
				if time.Now().After(deadline) {
					stop.Store(true)
					t.Fatalf("client %d stalled", i)
				}
				runtime.Gosched()
			}
		}
	}
	snapshot := func() (s [clients]int64) {
		for i := range clients {
			s[i] = counts[i].Load()
		}
		return s
	}
	waitAll(snapshot())
	closed.Store(true)
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	reused := grabFDs(t, other, oldFD, 64)
	waitAll(snapshot())
	waitClosed(t, b)
	if !reused {
		reused = grabFDs(t, other, oldFD, 256)
	}
	waitAll(snapshot())
	stop.Store(true)
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	var failed int64
	for i := range clients {
		failed += fails[i].Load()
	}
	t.Logf("descriptor %d reused: %v; %d reads failed after Close", oldFD, reused, failed)
	if failed == 0 {
		t.Error("no read failed after Close")
	}
}
