package dirty

import (
	"math/bits"
	"sync/atomic"
)

// Map records which chunks of a byte range were changed, for a copier
// that copies the range while it is written.
// Mark may run concurrently with itself and with Take: Take clears each
// word of the bitmap atomically as it reads it, so a chunk marked while it
// runs is either in its answer or still marked after it.
//
// The zero Map is not usable; use New.
type Map struct {
	shift uint
	size  int64
	words []atomic.Uint64
	count atomic.Int64 // chunks marked (approximate while Mark and Take race)
}

// maxBits bounds a Map's bitmap (1 MiB of words).
const maxBits = 8 << 20

// New returns an empty map of size bytes in chunks of chunk bytes
// (rounded up to a power of two, at least 512), or larger chunks if the
// bitmap would exceed 8 Mi chunks.
func New(size, chunk int64) *Map {
	shift := uint(9)
	for int64(1)<<shift < chunk {
		shift++
	}
	for (size>>shift)+1 > maxBits {
		shift++
	}
	nbits := (size + 1<<shift - 1) >> shift
	return &Map{shift: shift, size: size, words: make([]atomic.Uint64, (nbits+63)/64)}
}

// Size is the range's size in bytes.
func (d *Map) Size() int64 { return d.size }

// Chunk is the map's granularity in bytes.
func (d *Map) Chunk() int64 { return 1 << d.shift }

// Mark records that [off, off+n) changed; parts outside the range are
// ignored.
func (d *Map) Mark(off, n int64) {
	if off < 0 {
		n += off
		off = 0
	}
	n = min(n, d.size-off)
	if n <= 0 {
		return
	}
	first, last := off>>d.shift, (off+n-1)>>d.shift
	for i := first; i <= last; i++ {
		w := &d.words[i/64]
		m := uint64(1) << (i % 64)
		if w.Load()&m == 0 && w.Or(m)&m == 0 {
			d.count.Add(1)
		}
	}
}

// MarkAll marks the whole range.
func (d *Map) MarkAll() { d.Mark(0, d.size) }

// Bytes is (about) how many bytes are marked: whole chunks, so up to a
// chunk more than was written at each end.
func (d *Map) Bytes() int64 {
	return min(max(d.count.Load(), 0)<<d.shift, d.size)
}

// Range is a byte range.
type Range struct{ Off, Len int64 }

// Take returns the marked ranges, in order, merged, and clears them.
func (d *Map) Take() []Range {
	var out []Range
	for wi := range d.words {
		w := d.words[wi].Swap(0)
		if w == 0 {
			continue
		}
		d.count.Add(-int64(bits.OnesCount64(w)))
		for w != 0 {
			b := bits.TrailingZeros64(w)
			w &^= 1 << b
			off := (int64(wi)*64 + int64(b)) << d.shift
			n := min(int64(1)<<d.shift, d.size-off)
			if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == off {
				out[k].Len += n
				continue
			}
			out = append(out, Range{Off: off, Len: n})
		}
	}
	return out
}

// Total is the number of bytes in rs.
func Total(rs []Range) int64 {
	var t int64
	for _, r := range rs {
		t += r.Len
	}
	return t
}
