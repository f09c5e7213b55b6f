package characterize

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// fileDev is a real file used as the device under test.
type fileDev struct {
	*os.File
	size int64
}

func (f fileDev) Size() int64  { return f.size }
func (f fileDev) Flush() error { return f.Sync() }

func TestMeasureFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 16 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	p, err := Measure(context.Background(), fileDev{f, size}, Options{MaxStreams: 3, BytesPerStep: 4 << 20, RequestSize: 256 << 10, LatencyOps: 50, Model: "tmpfile"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.WriteBps) != 3 || len(p.ReadBps) != 3 || p.Latency4KUs <= 0 || p.Model != "tmpfile" {
		t.Fatalf("incomplete profile %+v", p)
	}
	for i := range p.WriteBps {
		if p.WriteBps[i] <= 0 || p.ReadBps[i] <= 0 {
			t.Fatalf("non-positive bandwidth in %+v", p)
		}
	}
	// The sweep really wrote its pattern at the start of stream 0's region.
	got := make([]byte, 16)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 7, 14, 21, 28, 35, 42, 49, 56, 63, 70, 77, 84, 91, 98, 105}
	if !bytes.Equal(got, want) {
		t.Fatalf("pattern %v, want %v", got, want)
	}
}

func TestMeasureTooSmall(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = Measure(context.Background(), fileDev{f, 1 << 20}, Options{MaxStreams: 4, RequestSize: 1 << 20})
	if !errors.Is(err, ErrTooSmall) {
		t.Fatalf("err = %v, want ErrTooSmall", err)
	}
}

type failDev struct{ fileDev }

var errBoom = errors.New("boom")

func (failDev) WriteAt([]byte, int64) (int, error) { return 0, errBoom }

func TestMeasureDeviceError(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = Measure(context.Background(), failDev{fileDev{f, 8 << 20}}, Options{MaxStreams: 2, BytesPerStep: 2 << 20, RequestSize: 1 << 20})
	if !errors.Is(err, errBoom) {
		t.Fatalf("err = %v, want errBoom", err)
	}
}

// TestMeasureRefusesOptions: options whose buffers or samples would not fit
// in memory (1,024 streams of 32 MiB hold 32 GiB; a latency probe of 2^40
// reads keeps 8 TiB of samples) are refused before anything is measured.
func TestMeasureRefusesOptions(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dev := fileDev{f, 8 << 20}
	for _, o := range []Options{
		{MaxStreams: 1, BytesPerStep: 1 << 20, RequestSize: 1 << 20, LatencyOps: 1 << 40},
		{MaxStreams: MaxStreams, RequestSize: 32 << 20},
		{MaxStreams: MaxStreams + 1, RequestSize: 4096},
	} {
		if _, err := Measure(context.Background(), dev, o); !errors.Is(err, ErrOptions) {
			t.Errorf("%+v: err = %v, want ErrOptions", o, err)
		}
	}
}
