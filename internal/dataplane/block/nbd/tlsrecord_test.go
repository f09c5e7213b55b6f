package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
)

// records builds a stream of TLS-shaped records with the given payload
// lengths (the payload bytes count up so that misplaced bytes show).
func records(lens ...int) []byte {
	var b []byte
	k := byte(0)
	for _, n := range lens {
		b = append(b, 23, 3, 3, byte(n>>8), byte(n))
		for i := 0; i < n; i++ {
			k++
			b = append(b, k)
		}
	}
	return b
}

// chunkReader returns its input in the chunk sizes given (cycling), as a
// socket returns what has arrived; it counts the reads.
type chunkReader struct {
	data   []byte
	sizes  []int
	i      int
	reads  int
	served int // bytes handed out so far
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	c.reads++
	n := min(len(p), len(c.data), max(1, c.sizes[c.i%len(c.sizes)]))
	c.i++
	copy(p, c.data[:n])
	c.data = c.data[n:]
	c.served += n
	return n, nil
}

// readRecordsAsTLS reads the stream as crypto/tls does (a header of at
// least 5 bytes, then the rest of the record, into a larger buffer) and
// checks that no Read crosses a record's end. It calls check after each
// record with the offset where the next one starts.
func readRecordsAsTLS(t *testing.T, r *recordReader, total int, check func(next int)) []byte {
	t.Helper()
	var out []byte
	buf := make([]byte, 70000)
	for len(out) < total {
		start := len(out)
		need := tlsRecordHeader
		for len(out)-start < need {
			n, err := r.Read(buf)
			if err != nil {
				t.Fatalf("at %d: %v", len(out), err)
			}
			out = append(out, buf[:n]...)
			if len(out)-start >= tlsRecordHeader {
				need = tlsRecordHeader + int(binary.BigEndian.Uint16(out[start+3:]))
			}
			if len(out)-start > need {
				t.Fatalf("a read crossed the record ending at %d (got to %d)", start+need, len(out))
			}
		}
		if check != nil {
			check(len(out))
		}
	}
	return out
}

func TestRecordReader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lens   []int
		chunks []int
	}{
		{"one record", []int{45}, []int{1 << 20}},
		{"requests together", []int{45, 45, 45, 45}, []int{1 << 20}},
		{"byte by byte", []int{45, 0, 3, 45}, []int{1}},
		{"header split", []int{45, 45}, []int{3, 4, 50, 2}},
		{"empty records", []int{0, 0, 45, 0}, []int{7}},
		{"large records", []int{16 << 10, 45, 16<<10 + 256, 65535}, []int{100, 1 << 16, 9000}},
		{"large then small", []int{65535, 45, 45}, []int{65536, 1 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := records(tc.lens...)
			src := &chunkReader{data: in, sizes: tc.chunks}
			r := newRecordReader(src)
			waits := 0
			readsAtWait := -1
			r.wait = func() error {
				waits++
				readsAtWait = src.reads
				return nil
			}
			out := readRecordsAsTLS(t, r, len(in), func(next int) {
				// A whole record reported buffered must have come from
				// the source already; after the last, none is.
				if !r.recordBuffered() {
					return
				}
				if next == len(in) {
					t.Fatalf("a record reported buffered after the last one")
				}
				end := next + tlsRecordHeader + int(binary.BigEndian.Uint16(in[next+3:]))
				if src.served < end {
					t.Fatalf("record at %d reported buffered, but only %d of its %d bytes were read", next, src.served, end)
				}
			})
			if !bytes.Equal(out, in) {
				t.Fatal("bytes differ")
			}
			// Every read of the source came after a wait: the reader's
			// replies go out before it can block.
			if waits != src.reads || readsAtWait != src.reads-1 {
				t.Fatalf("%d source reads, %d waits", src.reads, waits)
			}
			if n, err := r.Read(make([]byte, 10)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("after the end: %d, %v", n, err)
			}
		})
	}
}

func TestRecordReaderBuffered(t *testing.T) {
	// Three small records arrive together: after the first is taken the
	// next two are reported buffered without a read of the source, and
	// the wait hook is not called until they are gone.
	in := records(45, 45, 45)
	src := &chunkReader{data: in, sizes: []int{1 << 20}}
	r := newRecordReader(src)
	waits := 0
	r.wait = func() error { waits++; return nil }
	if r.recordBuffered() {
		t.Fatal("buffered before anything was read")
	}
	buf := make([]byte, 1000)
	for i := 0; i < 3; i++ {
		if n, err := r.Read(buf); err != nil || n != 50 {
			t.Fatalf("record %d: %d, %v", i, n, err)
		}
		if got, want := r.recordBuffered(), i < 2; got != want {
			t.Fatalf("after record %d: buffered %v", i, got)
		}
	}
	if waits != 1 || src.reads != 1 {
		t.Fatalf("%d waits, %d reads of the source", waits, src.reads)
	}
	// A record of which part is here is not whole.
	in = records(45, 45)
	src = &chunkReader{data: in, sizes: []int{50 + 20, 1 << 20}}
	r = newRecordReader(src)
	if n, err := r.Read(buf); err != nil || n != 50 {
		t.Fatalf("%d, %v", n, err)
	}
	if r.recordBuffered() {
		t.Fatal("a partial record reported buffered")
	}
	if n, err := r.Read(buf); err != nil || n != 20 {
		t.Fatalf("the rest that is here: %d, %v", n, err)
	}
	// A failing wait (the replies could not be sent) ends the reads.
	boom := errors.New("boom")
	r.wait = func() error { return boom }
	if _, err := r.Read(buf); !errors.Is(err, boom) {
		t.Fatalf("wait error: %v", err)
	}
	// A stream ending inside a header is an unexpected EOF.
	r = newRecordReader(bytes.NewReader([]byte{23, 3}))
	if _, err := r.Read(buf); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated header: %v", err)
	}
}

// FuzzRecordReader reads arbitrary bytes, in arbitrary chunks, through the
// record reader as crypto/tls does: the bytes pass unchanged and no read
// crosses the end of a record.
func FuzzRecordReader(f *testing.F) {
	f.Add(records(45, 45), uint64(1))
	f.Add(records(0, 16<<10, 3), uint64(7))
	f.Add([]byte{23, 3, 3, 0xff, 0xff, 1, 2}, uint64(3))
	f.Add([]byte{1, 2, 3}, uint64(0))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, seed))
		sizes := make([]int, 8)
		for i := range sizes {
			sizes[i] = 1 + rng.IntN(70000)
		}
		r := newRecordReader(&chunkReader{data: in, sizes: sizes})
		var out []byte
		buf := make([]byte, 1+rng.IntN(70000))
		recStart, need := 0, -1
		var err error
		for {
			var n int
			n, err = r.Read(buf)
			if n > len(buf) {
				t.Fatalf("read %d into %d", n, len(buf))
			}
			out = append(out, buf[:n]...)
			if need < 0 && len(out)-recStart >= tlsRecordHeader {
				need = tlsRecordHeader + int(binary.BigEndian.Uint16(out[recStart+3:]))
			}
			if need >= 0 && len(out)-recStart > need {
				t.Fatalf("a read crossed the record ending at %d", recStart+need)
			}
			if need >= 0 && len(out)-recStart == need {
				recStart, need = len(out), -1
			}
			if err != nil {
				break
			}
		}
		if !bytes.HasPrefix(in, out) {
			t.Fatal("bytes changed")
		}
		// Only a header cut short by the end of the stream stays behind.
		if rest := len(in) - len(out); rest != 0 && (rest >= tlsRecordHeader || !errors.Is(err, io.ErrUnexpectedEOF)) {
			t.Fatalf("passed %d of %d bytes (%v)", len(out), len(in), err)
		}
	})
}

// TestTLSPipelined sends requests many at a time over TLS, so that the
// server finds whole records queued behind the one it reads and serves
// them in batches; every reply must still arrive and match.
func TestTLSPipelined(t *testing.T) {
	p := newTestPKI(t)
	be := NewMemBackend(8 << 20)
	_, addr := startTLSServer(t, p.server, false, Export{Name: testName, Backend: be})
	c := dial(t, addr, testName, WithTLS(p.clientConfig()))
	want := make([]byte, 8<<20)
	for i := range want {
		want[i] = byte(i / 4096 * 7)
	}
	if _, err := c.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			buf := make([]byte, 4096)
			for i := 0; i < 200; i++ {
				off := rng.Int64N(int64(len(want))/4096) * 4096
				if g%4 == 0 && i%10 == 0 {
					// Writes of what is already there keep the image as it is.
					if _, err := c.WriteAt(want[off:off+4096], off); err != nil {
						errs <- err
						return
					}
					continue
				}
				if _, err := c.ReadAt(buf, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf, want[off:off+4096]) {
					errs <- errors.New("a pipelined read returned the wrong bytes")
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestRecordReaderGrows: while reads fill its buffer (a client streaming
// large writes), the record reader's buffer grows to recordBufMax, so that
// one read takes more records; the records come out whole and in order.
// A source that never fills it leaves it at recordBufMin.
func TestRecordReaderGrows(t *testing.T) {
	lens := make([]int, 64)
	for i := range lens {
		lens[i] = 16<<10 + 17
	}
	for _, tc := range []struct {
		name  string
		chunk int
		want  int
	}{
		{"streaming", 1 << 20, recordBufMax},
		{"small reads", 4000, recordBufMin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := records(lens...)
			src := &chunkReader{data: in, sizes: []int{tc.chunk}}
			r := newRecordReader(src)
			out := readRecordsAsTLS(t, r, len(in), nil)
			if !bytes.Equal(out, in) {
				t.Fatal("records changed on the way")
			}
			if len(r.buf) != tc.want {
				t.Fatalf("buffer of %d bytes, want %d", len(r.buf), tc.want)
			}
		})
	}
}
