package stripe

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// memDev is an in-memory Device that records calls.
type memDev struct {
	mu      sync.RWMutex
	b       []byte
	flushes atomic.Int64
	calls   atomic.Int64
	closed  atomic.Bool
	fail    error // returned by every I/O call when set
}

func newMem(size int) *memDev { return &memDev{b: make([]byte, size)} }

func (m *memDev) ReadAt(p []byte, off int64) (int, error) {
	m.calls.Add(1)
	if m.fail != nil {
		return 0, m.fail
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if off < 0 || off+int64(len(p)) > int64(len(m.b)) {
		return 0, fmt.Errorf("memDev: read [%d,+%d) out of %d", off, len(p), len(m.b))
	}
	return copy(p, m.b[off:]), nil
}

func (m *memDev) WriteAt(p []byte, off int64) (int, error) {
	m.calls.Add(1)
	if m.fail != nil {
		return 0, m.fail
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(m.b)) {
		return 0, fmt.Errorf("memDev: write [%d,+%d) out of %d", off, len(p), len(m.b))
	}
	return copy(m.b[off:], p), nil
}

func (m *memDev) Flush() error { m.flushes.Add(1); return m.fail }
func (m *memDev) Size() int64  { return int64(len(m.b)) }
func (m *memDev) Close() error { m.closed.Store(true); return nil }

// trimDev adds Trim and WriteZeroes (both zero the range).
type trimDev struct{ *memDev }

func (t trimDev) Trim(off, n int64) error { return t.WriteZeroes(off, n, false) }
func (t trimDev) WriteZeroes(off, n int64, _ bool) error {
	_, err := t.WriteAt(make([]byte, n), off)
	return err
}

// hangDev blocks every call until Close, like a lender that vanished from the
// network without resetting the connection.
type hangDev struct {
	size    int64
	once    sync.Once
	gone    chan struct{}
	calls   atomic.Int64
	entered chan struct{} // one token per call, if there is room
}

func newHang(size int64) *hangDev {
	return &hangDev{size: size, gone: make(chan struct{}), entered: make(chan struct{}, 64)}
}
func (h *hangDev) wait() error {
	h.calls.Add(1)
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.gone
	return errors.New("hangDev: closed")
}
func (h *hangDev) ReadAt(p []byte, off int64) (int, error)  { return 0, h.wait() }
func (h *hangDev) WriteAt(p []byte, off int64) (int, error) { return 0, h.wait() }
func (h *hangDev) Flush() error                             { return h.wait() }
func (h *hangDev) Size() int64                              { return h.size }
func (h *hangDev) Close() error                             { h.once.Do(func() { close(h.gone) }); return nil }

func devices(ms ...*memDev) []Device {
	ds := make([]Device, len(ms))
	for i, m := range ms {
		ds[i] = m
	}
	return ds
}

// sizedDev is a memDev that reports a size of its own, as a remote device
// says what it likes.
type sizedDev struct {
	*memDev
	size int64
}

func (d sizedDev) Size() int64 { return d.size }

func TestNewRefusesDeviceSizes(t *testing.T) {
	for _, sizes := range [][]int64{{-1 << 20, 1 << 20}, {math.MinInt64}, {1 << 62, 1 << 62}, {math.MaxInt64, math.MaxInt64, 1 << 62}} {
		devs := make([]Device, len(sizes))
		for i, s := range sizes {
			devs[i] = sizedDev{newMem(0), s}
		}
		if v, err := New(devs, Config{}); err == nil {
			t.Errorf("devices of %v bytes make a volume of %d", sizes, v.Size())
		} else if !errors.Is(err, ErrConfig) {
			t.Errorf("devices of %v bytes: New = %v, want ErrConfig", sizes, err)
		}
	}
	v, err := New([]Device{sizedDev{newMem(0), 1 << 61}, sizedDev{newMem(0), 1 << 61}}, Config{})
	if err != nil || v.Size() != 1<<62 {
		t.Fatalf("two devices of 2^61 bytes: %v", err)
	}
}

func TestNewConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sizes []int
		unit  int64
		want  int64 // volume size; -1 = error
	}{
		{"default unit", []int{1 << 20, 1 << 20}, 0, 2 << 20},
		{"min of sizes", []int{1 << 20, 3 << 20, 2 << 20}, 64 << 10, 3 << 20},
		{"rounded to unit", []int{100<<10 + 5, 200 << 10}, 64 << 10, 2 * 64 << 10},
		{"smaller than unit", []int{1000, 1 << 20}, 4 << 10, -1},
		{"not power of two", []int{1 << 20}, 96 << 10, -1},
		{"too small unit", []int{1 << 20}, 512, -1},
		{"too large unit", []int{64 << 20}, 32 << 20, -1},
		{"no devices", nil, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ms []*memDev
			for _, s := range tc.sizes {
				ms = append(ms, newMem(s))
			}
			v, err := New(devices(ms...), Config{StripeUnit: tc.unit})
			if tc.want < 0 {
				if !errors.Is(err, ErrConfig) {
					t.Fatalf("New = %v, want ErrConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Size() != tc.want {
				t.Errorf("Size = %d, want %d", v.Size(), tc.want)
			}
		})
	}
}

// TestLayout checks the documented placement formula byte by byte.
func TestLayout(t *testing.T) {
	const unit, n = 4 << 10, 3
	ms := []*memDev{newMem(5 * unit), newMem(5 * unit), newMem(5 * unit)}
	v, err := New(devices(ms...), Config{StripeUnit: unit})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, v.Size())
	for i := range data {
		data[i] = byte(i*7 + i/unit)
	}
	if _, err := v.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	for x := int64(0); x < v.Size(); x++ {
		u := x / unit
		d, off := u%n, (u/n)*unit+x%unit
		if got := ms[d].b[off]; got != data[x] {
			t.Fatalf("byte %d: device %d offset %d = %d, want %d", x, d, off, got, data[x])
		}
	}
}

// TestIntegrity writes and reads random ranges (odd offsets and lengths,
// crossing units and wrapping devices) and compares with a reference slice.
func TestIntegrity(t *testing.T) {
	for _, unit := range []int64{4 << 10, 64 << 10, 1 << 20} {
		for _, n := range []int{1, 2, 3, 5} {
			if unit >= 1<<20 && n != 3 {
				continue // keep the race-detector run short
			}
			t.Run(fmt.Sprintf("unit=%dK/n=%d", unit>>10, n), func(t *testing.T) {
				rows := int64(4)
				if unit >= 1<<20 {
					rows = 2 // keep the race-detector run short
				}
				rng := rand.New(rand.NewPCG(uint64(unit), uint64(n)))
				fill := rand.NewChaCha8([32]byte{byte(n), byte(unit >> 12)})
				var ms []*memDev
				for i := range n {
					// Unequal sizes: the volume uses the smallest.
					ms = append(ms, newMem(int(rows*unit)+i*1000+int(unit)/3))
				}
				v, err := New(devices(ms...), Config{StripeUnit: unit})
				if err != nil {
					t.Fatal(err)
				}
				if want := int64(n) * rows * unit; v.Size() != want {
					t.Fatalf("Size = %d, want %d", v.Size(), want)
				}
				ref := make([]byte, v.Size())
				cases := []struct{ off, len int64 }{
					{0, v.Size()}, {1, 1}, {unit - 1, 2}, {unit - 3, unit + 7},
					{v.Size() - 1, 1}, {3, v.Size() - 5}, {unit, int64(n) * unit},
				}
				for range 25 {
					off := rng.Int64N(v.Size())
					cases = append(cases, struct{ off, len int64 }{off, 1 + rng.Int64N(min(v.Size()-off, 2*int64(n)*unit))})
				}
				for i, c := range cases {
					buf := make([]byte, c.len)
					_, _ = fill.Read(buf)
					if k, err := v.WriteAt(buf, c.off); err != nil || k != len(buf) {
						t.Fatalf("case %d WriteAt(%d, +%d) = %d, %v", i, c.off, c.len, k, err)
					}
					copy(ref[c.off:], buf)
					// Read back a different random range.
					roff := rng.Int64N(v.Size())
					rlen := 1 + rng.Int64N(min(v.Size()-roff, 2*int64(n)*unit))
					got := make([]byte, rlen)
					if k, err := v.ReadAt(got, roff); err != nil || k != len(got) {
						t.Fatalf("case %d ReadAt(%d, +%d) = %d, %v", i, roff, rlen, k, err)
					}
					if !bytes.Equal(got, ref[roff:roff+rlen]) {
						t.Fatalf("case %d: ReadAt(%d, +%d) differs from reference", i, roff, rlen)
					}
				}
				all := make([]byte, v.Size())
				if _, err := v.ReadAt(all, 0); err != nil || !bytes.Equal(all, ref) {
					t.Fatalf("full read differs from reference (err %v)", err)
				}
			})
		}
	}
}

func TestBounds(t *testing.T) {
	v, err := New(devices(newMem(64<<10), newMem(64<<10)), Config{StripeUnit: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	size := v.Size()
	buf := make([]byte, 10)
	if n, err := v.ReadAt(buf, size-4); n != 4 || err != io.EOF {
		t.Errorf("ReadAt across end = %d, %v; want 4, EOF", n, err)
	}
	if n, err := v.ReadAt(buf, size); n != 0 || err != io.EOF {
		t.Errorf("ReadAt at end = %d, %v; want 0, EOF", n, err)
	}
	if _, err := v.ReadAt(buf, -1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("ReadAt(-1) = %v", err)
	}
	if _, err := v.WriteAt(buf, size-4); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("WriteAt across end = %v", err)
	}
	if _, err := v.WriteAt(buf, -3); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("WriteAt(-3) = %v", err)
	}
	if err := v.Trim(0, 4096); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Trim on devices without Trim = %v", err)
	}
	if _, err := v.WriteAt(nil, size); err != nil {
		t.Errorf("empty WriteAt at end = %v", err)
	}
	// Without device support WriteZeroes writes zero buffers.
	if _, err := v.WriteAt(bytes.Repeat([]byte{1}, 3*4096), 4000); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroes(4001, 2*4096, false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3*4096)
	if _, err := v.ReadAt(got, 4000); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{1}, 3*4096)
	clear(want[1 : 1+2*4096])
	if !bytes.Equal(got, want) {
		t.Error("WriteZeroes by buffers: wrong contents")
	}
}

func TestTrimAndZeroes(t *testing.T) {
	const unit = 4 << 10
	ms := []*memDev{newMem(8 * unit), newMem(8 * unit), newMem(8 * unit)}
	ds := []Device{trimDev{ms[0]}, trimDev{ms[1]}, trimDev{ms[2]}}
	v, err := New(ds, Config{StripeUnit: unit})
	if err != nil {
		t.Fatal(err)
	}
	if !v.CanTrim() || !v.CanWriteZeroes() {
		t.Fatal("volume over trimming devices cannot trim")
	}
	ref := bytes.Repeat([]byte{0xAB}, int(v.Size()))
	if _, err := v.WriteAt(ref, 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		zero     bool
		off, len int64
	}{{false, 5, 3}, {true, unit - 7, 3*unit + 20}, {false, 2 * unit, 7 * unit}, {true, 20 * unit, 4 * unit}} {
		var err error
		if c.zero {
			err = v.WriteZeroes(c.off, c.len, false)
		} else {
			err = v.Trim(c.off, c.len)
		}
		if err != nil {
			t.Fatal(err)
		}
		clear(ref[c.off : c.off+c.len])
		// One call per device at most.
		got := make([]byte, v.Size())
		if _, err := v.ReadAt(got, 0); err != nil || !bytes.Equal(got, ref) {
			t.Fatalf("after %+v: volume differs from reference (%v)", c, err)
		}
	}
	if err := v.Trim(v.Size()-1, 2); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("Trim across end = %v", err)
	}
	// A volume over mixed devices cannot trim; a volume of volumes can.
	mixed, _ := New([]Device{trimDev{newMem(unit)}, newMem(unit)}, Config{StripeUnit: unit})
	if mixed.CanTrim() {
		t.Error("mixed volume claims Trim")
	}
	nested, _ := New([]Device{v, mixed}, Config{StripeUnit: unit})
	if nested.CanTrim() {
		t.Error("volume over a non-trimming volume claims Trim")
	}
}

func TestFlushAndErrors(t *testing.T) {
	ms := []*memDev{newMem(1 << 20), newMem(1 << 20), newMem(1 << 20)}
	v, _ := New(devices(ms...), Config{StripeUnit: 64 << 10})
	flushes := func() []int64 {
		var n []int64
		for _, m := range ms {
			n = append(n, m.flushes.Load())
		}
		return n
	}
	// Nothing written: nothing to make durable.
	if err := v.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := flushes(); !slices.Equal(got, []int64{0, 0, 0}) {
		t.Errorf("flushes after a flush of a clean volume = %v, want none", got)
	}
	// A write over every device: each is flushed once, then never again
	// until it is written to.
	if _, err := v.WriteAt(make([]byte, 3*64<<10), 0); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := v.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if got := flushes(); !slices.Equal(got, []int64{1, 1, 1}) {
		t.Errorf("flushes after writing every device = %v, want [1 1 1]", got)
	}
	// A write (or trim, or zeroing) of one unit: only its device.
	if _, err := v.WriteAt(make([]byte, 4096), 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroes(2*64<<10, 4096, false); err != nil {
		t.Fatal(err)
	}
	if err := v.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := flushes(); !slices.Equal(got, []int64{1, 2, 2}) {
		t.Errorf("flushes after writing devices 1 and 2 = %v, want [1 2 2]", got)
	}
	boom := errors.New("boom")
	if _, err := v.WriteAt(make([]byte, 4096), 64<<10); err != nil {
		t.Fatal(err)
	}
	ms[1].fail = boom
	if _, err := v.ReadAt(make([]byte, 1<<20), 0); !errors.Is(err, boom) {
		t.Errorf("ReadAt with a failing device = %v", err)
	}
	if err := v.Flush(); !errors.Is(err, boom) {
		t.Errorf("Flush with a failing device that has unflushed writes = %v", err)
	}
	// A request that does not touch device 1 still works.
	if _, err := v.ReadAt(make([]byte, 100), 0); err != nil {
		t.Errorf("ReadAt on device 0 only = %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if !m.closed.Load() {
			t.Errorf("device %d not closed", i)
		}
	}
	if _, err := v.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadAt after Close = %v", err)
	}
}

// TestDeadline: a device that stops answering fails the request within the
// bound, is closed, and fails later requests at once.
func TestDeadline(t *testing.T) {
	const timeout = 500 * time.Millisecond
	h := newHang(1 << 20)
	good := newMem(1 << 20)
	v, _ := New([]Device{good, h}, Config{StripeUnit: 64 << 10, RequestTimeout: timeout})
	for _, op := range []struct {
		name string
		f    func() error
	}{
		{"read", func() error { _, err := v.ReadAt(make([]byte, 256<<10), 0); return err }},
		{"write", func() error { _, err := v.WriteAt(make([]byte, 256<<10), 0); return err }},
		{"flush", v.Flush},
	} {
		start := time.Now()
		err := op.f()
		el := time.Since(start)
		if err == nil {
			t.Fatalf("%s over a hung device succeeded", op.name)
		}
		if op.name == "read" {
			if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrDeviceFailed) {
				t.Errorf("%s: %v, want ErrTimeout", op.name, err)
			}
			if el < timeout || el > 10*timeout {
				t.Errorf("%s failed after %v, want about %v", op.name, el, timeout)
			}
		} else if !errors.Is(err, ErrDeviceFailed) || !errors.Is(err, ErrTimeout) || el > timeout {
			t.Errorf("%s after failure: %v after %v, want ErrDeviceFailed at once", op.name, err, el)
		}
	}
	if f := v.Failed(); len(f) != 1 || f[0] != 1 {
		t.Errorf("Failed = %v, want [1]", f)
	}
	// Only the first request reached the hung device.
	if c := h.calls.Load(); c != 2 {
		t.Errorf("hung device saw %d calls, want 2 (two units of the first read)", c)
	}
	// The healthy device alone still serves its units.
	if _, err := v.ReadAt(make([]byte, 64<<10), 0); err != nil {
		t.Errorf("read of device 0's unit: %v", err)
	}
}

func TestConcurrent(t *testing.T) {
	const unit = 4 << 10
	v, _ := New(devices(newMem(64*unit), newMem(64*unit), newMem(64*unit)), Config{StripeUnit: unit})
	// Each goroutine owns a disjoint region and verifies its own data.
	var wg sync.WaitGroup
	region := v.Size() / 8
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			base := int64(g) * region
			ref := make([]byte, region)
			for range 25 {
				off := rng.Int64N(region)
				n := 1 + rng.Int64N(region-off)
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(i*31 + g)
				}
				if _, err := v.WriteAt(b, base+off); err != nil {
					t.Error(err)
					return
				}
				copy(ref[off:], b)
				got := make([]byte, region)
				if _, err := v.ReadAt(got, base); err != nil || !bytes.Equal(got, ref) {
					t.Errorf("goroutine %d: region differs (%v)", g, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestPool(t *testing.T) {
	a, b := newMem(1<<20), newMem(1<<20)
	// Both connections reach the same export: share the bytes.
	b.b = a.b
	p, err := NewPool(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewPool(a, newMem(2<<20)); !errors.Is(err, ErrConfig) {
		t.Errorf("NewPool with unequal sizes = %v", err)
	}
	if p.CanTrim() {
		t.Error("pool of non-trimming devices claims Trim")
	}
	v, _ := New([]Device{p}, Config{StripeUnit: 4 << 10})
	if v.CanTrim() {
		t.Error("volume over non-trimming pool claims Trim")
	}
	// Concurrent requests spread over both connections.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			buf := bytes.Repeat([]byte{byte(i)}, 4<<10)
			if _, err := v.WriteAt(buf, int64(i)*4<<10); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if a.calls.Load() == 0 && b.calls.Load() == 0 {
		t.Error("no calls reached the pool")
	}
	if err := v.Flush(); err != nil {
		t.Fatal(err)
	}
	if a.flushes.Load() != 1 || b.flushes.Load() != 1 {
		t.Errorf("pool flushes = %d, %d; want 1, 1", a.flushes.Load(), b.flushes.Load())
	}
	if err := v.Close(); err != nil || !a.closed.Load() || !b.closed.Load() {
		t.Errorf("Close = %v, closed %v %v", err, a.closed.Load(), b.closed.Load())
	}
}

// FuzzStripe writes a fuzzed range of a fuzzed layout and checks the whole
// volume against a reference slice and the documented placement formula.
func FuzzStripe(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint32(0), uint32(1))
	f.Add(uint8(2), uint8(3), uint32(4095), uint32(8193))
	f.Add(uint8(1), uint8(5), uint32(12345), uint32(70000))
	f.Fuzz(func(t *testing.T, unitShift, parts uint8, off, length uint32) {
		unit := int64(MinStripeUnit) << (unitShift % 3) // 4, 8, 16 KiB
		n := 1 + int(parts%5)
		ms := make([]*memDev, n)
		for i := range ms {
			ms[i] = newMem(int(4*unit) + i*513)
		}
		v, err := New(devices(ms...), Config{StripeUnit: unit})
		if err != nil {
			t.Fatal(err)
		}
		size := v.Size()
		o := int64(off) % size
		l := 1 + int64(length)%(size-o)
		buf := make([]byte, l)
		for i := range buf {
			buf[i] = byte(i*7 + 1)
		}
		if _, err := v.WriteAt(buf, o); err != nil {
			t.Fatal(err)
		}
		ref := make([]byte, size)
		copy(ref[o:], buf)
		got := make([]byte, size)
		if _, err := v.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, ref) {
			t.Fatalf("unit %d, %d parts, write [%d,+%d): volume differs from reference", unit, n, o, l)
		}
		for x := int64(0); x < size; x++ {
			u := x / unit
			if ms[u%int64(n)].b[(u/int64(n))*unit+x%unit] != ref[x] {
				t.Fatalf("byte %d not where the layout formula puts it", x)
			}
		}
	})
}

// liveDev is a memDev with a liveness flag and a multi-conn answer.
type liveDev struct {
	*memDev
	dead      atomic.Bool
	multiConn bool
}

func (l *liveDev) Alive() bool         { return !l.dead.Load() }
func (l *liveDev) MultiConnSafe() bool { return l.multiConn }

func TestPoolSkipsDeadConnections(t *testing.T) {
	for _, multiConn := range []bool{true, false} {
		t.Run(fmt.Sprintf("multiconn=%v", multiConn), func(t *testing.T) {
			shared := newMem(64 << 10)
			a := &liveDev{memDev: shared, multiConn: multiConn}
			b := &liveDev{memDev: &memDev{b: shared.b}, multiConn: multiConn}
			p, err := NewPool(a, b)
			if err != nil {
				t.Fatal(err)
			}
			b.dead.Store(true)
			b.fail = errors.New("connection reset")
			for i := range 10 {
				if _, err := p.WriteAt([]byte{byte(i)}, int64(i)); err != nil {
					t.Fatalf("write %d through a pool with one dead connection: %v", i, err)
				}
			}
			if b.calls.Load() != 0 {
				t.Errorf("dead connection got %d calls", b.calls.Load())
			}
			err = p.Flush()
			if multiConn && err != nil {
				t.Errorf("Flush with a multi-conn server: %v", err)
			}
			if !multiConn && !errors.Is(err, ErrDeviceFailed) {
				t.Errorf("Flush without multi-conn after a connection broke = %v, want ErrDeviceFailed", err)
			}
			a.dead.Store(true)
			if p.Alive() {
				t.Error("pool with no live connection reports Alive")
			}
			if err := p.Flush(); !errors.Is(err, ErrDeviceFailed) {
				t.Errorf("Flush with no live connection = %v", err)
			}
		})
	}
}
