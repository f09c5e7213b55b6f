package nbd

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// benchClient dials $NBD_BENCH_URI (any server, for comparisons) or an
// in-process export of a 64 MiB memory backend.
func benchClient(b *testing.B) *Client {
	if uri := os.Getenv("NBD_BENCH_URI"); uri != "" {
		c, err := DialURI(context.Background(), uri)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	_, addr := startServer(b, Export{Name: testName, Backend: NewMemBackend(64 << 20)})
	return dial(b, addr, testName)
}

func BenchmarkRead4KQD1(b *testing.B) {
	c := benchClient(b)
	buf := make([]byte, 4096)
	blocks := c.Size() / 4096
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := c.ReadAt(buf, rand.Int64N(blocks)*4096); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead4KQD1Deadline is BenchmarkRead4KQD1 of an export with a
// deadline (a lease's expiry, on the real clock), which every request
// checks: compare the two for its cost.
func BenchmarkRead4KQD1Deadline(b *testing.B) {
	dl := clock.NewDeadline(nil)
	dl.Set(time.Now().Add(time.Hour))
	_, addr := startServer(b, Export{Name: testName, Backend: NewMemBackend(64 << 20), Deadline: dl})
	c := dial(b, addr, testName)
	buf := make([]byte, 4096)
	blocks := c.Size() / 4096
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := c.ReadAt(buf, rand.Int64N(blocks)*4096); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRead4KQD32(b *testing.B) {
	c := benchClient(b)
	blocks := c.Size() / 4096
	b.SetBytes(4096)
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		for pb.Next() {
			if _, err := c.ReadAt(buf, rand.Int64N(blocks)*4096); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReexportWrite8KFlush measures an 8 KiB write and a FLUSH through
// a re-export (a Server whose backend is a Client of another Server, as
// `rialto attach` is), from a Client at queue depth 1.
func BenchmarkReexportWrite8KFlush(b *testing.B) {
	_, addr := startServer(b, Export{Name: testName, Backend: NewMemBackend(64 << 20)})
	part := dial(b, addr, testName)
	_, addr2 := startServer(b, Export{Name: testName, Backend: part})
	c := dial(b, addr2, testName)
	buf := make([]byte, 8192)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.WriteAt(buf, 8192); err != nil {
			b.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			b.Fatal(err)
		}
	}
}
