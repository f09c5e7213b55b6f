package dirty

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

func TestMap(t *testing.T) {
	for _, tc := range []struct {
		name        string
		size, chunk int64
		marks       [][2]int64
		want        []Range
		wantBytes   int64
	}{
		{"empty", 1 << 20, 4096, nil, nil, 0},
		{"one byte marks its chunk", 1 << 20, 4096, [][2]int64{{5000, 1}}, []Range{{4096, 4096}}, 4096},
		{"adjacent chunks merge", 1 << 20, 4096, [][2]int64{{0, 4096}, {4096, 100}}, []Range{{0, 8192}}, 8192},
		{"gaps stay apart", 1 << 20, 4096, [][2]int64{{0, 1}, {3 * 4096, 1}}, []Range{{0, 4096}, {3 * 4096, 4096}}, 8192},
		{"across a word", 1 << 20, 4096, [][2]int64{{62 * 4096, 4 * 4096}}, []Range{{62 * 4096, 4 * 4096}}, 4 * 4096},
		{"clipped at the end", 10000, 4096, [][2]int64{{9000, 5000}}, []Range{{8192, 10000 - 8192}}, 4096}, // Bytes counts whole chunks
		{"outside ignored", 1 << 20, 4096, [][2]int64{{-10, 5}, {1 << 20, 10}, {2 << 20, 1}}, nil, 0},
		{"chunk rounds up to a power of two", 1 << 20, 3000, [][2]int64{{4095, 2}}, []Range{{0, 8192}}, 8192},
		{"remarking counts once", 1 << 20, 4096, [][2]int64{{0, 10}, {0, 10}, {1, 1}}, []Range{{0, 4096}}, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(tc.size, tc.chunk)
			for _, m := range tc.marks {
				d.Mark(m[0], m[1])
			}
			if got := d.Bytes(); got != tc.wantBytes {
				t.Errorf("Bytes = %d, want %d", got, tc.wantBytes)
			}
			got := d.Take()
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("Take = %v, want %v", got, tc.want)
			}
			if again := d.Take(); len(again) != 0 || d.Bytes() != 0 {
				t.Errorf("after Take: %v, %d bytes", again, d.Bytes())
			}
		})
	}
	if d := New(1<<40, 4096); d.Chunk() <= 4096 || int64(len(d.words))*64 > maxBits+64 {
		t.Errorf("a 1 TiB map has chunks of %d and %d words", d.Chunk(), len(d.words))
	}
}

// TestMapConcurrent: marks racing with Take are never lost.
func TestMapConcurrent(t *testing.T) {
	const size = 1 << 24
	d := New(size, 4096)
	seen := make([]atomic.Bool, size/4096)
	var marked []int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	stop := make(chan struct{})
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 20000 {
				c := r.Int64N(size / 4096)
				d.Mark(c*4096, 1)
				mu.Lock()
				marked = append(marked, c)
				mu.Unlock()
			}
		})
	}
	var takerWG sync.WaitGroup
	takerWG.Go(func() {
		for {
			for _, r := range d.Take() {
				for o := r.Off; o < r.Off+r.Len; o += 4096 {
					seen[o/4096].Store(true)
				}
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	})
	wg.Wait()
	close(stop)
	takerWG.Wait()
	for _, r := range d.Take() {
		for o := r.Off; o < r.Off+r.Len; o += 4096 {
			seen[o/4096].Store(true)
		}
	}
	for _, c := range marked {
		if !seen[c].Load() {
			t.Fatalf("chunk %d was marked and never taken", c)
		}
	}
}
