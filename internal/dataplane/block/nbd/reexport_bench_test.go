package nbd

import (
	"testing"
)

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
