package nbd

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rialto-project/rialto/internal/loopdevtest"
)

// filledFile is a file of size bytes, every one of them fill.
func filledFile(t testing.TB, size int, fill byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "shared.img")
	if err := os.WriteFile(p, bytes.Repeat([]byte{fill}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPartitionOpsStayInside: trim and write-zeroes through a partition of
// a shared file or block device (an unaligned one too) zero what they
// should and never touch a byte of the neighbouring partitions, whichever
// mechanism serves them (hole punching, zero range, BLKDISCARD, BLKZEROOUT,
// writing zeroes).
func TestPartitionOpsStayInside(t *testing.T) {
	const size = 1 << 20
	type target struct {
		name string
		path func(t *testing.T, file string) string
	}
	targets := []target{
		{"file", func(_ *testing.T, file string) string { return file }},
		{"block device", func(t *testing.T, file string) string { return loopdevtest.Attach(t, file) }},
	}
	// Each mechanism in turn: the first choice, then with the earlier
	// ones marked unsupported.
	mechanisms := []struct {
		name string
		set  func(b *FileBackend)
	}{
		{"first choice", func(*FileBackend) {}},
		{"no fallocate", func(b *FileBackend) { b.noPunch.Store(true); b.noZero.Store(true) }},
		{"writes only", func(b *FileBackend) {
			b.noPunch.Store(true)
			b.noZero.Store(true)
			b.noZeroOut.Store(true)
			b.noDiscard.Store(true)
		}},
	}
	for _, tg := range targets {
		for _, mech := range mechanisms {
			for _, base := range []int64{256 << 10, 256<<10 + 100} {
				t.Run(fmt.Sprintf("%s/%s/base=%d", tg.name, mech.name, base), func(t *testing.T) {
					file := filledFile(t, size, 0xaa)
					p := tg.path(t, file)
					const plen = 128 << 10
					b, err := OpenFile(p, FileOptions{Offset: base, Length: plen})
					if err != nil {
						t.Fatal(err)
					}
					defer b.Close()
					mech.set(b)
					// An unaligned trim, an unaligned zeroing of either kind
					// and an aligned one covering the partition's end.
					if err := b.Trim(1000, 20000); err != nil {
						t.Fatal(err)
					}
					if err := b.WriteZeroes(30000, 10001, false); err != nil {
						t.Fatal(err)
					}
					if err := b.WriteZeroes(50001, 7000, true); err != nil {
						t.Fatal(err)
					}
					if err := b.WriteZeroes(plen-8192, 8192, false); err != nil {
						t.Fatal(err)
					}
					if err := b.Flush(); err != nil {
						t.Fatal(err)
					}
					got := make([]byte, plen)
					if _, err := b.ReadAt(got, 0); err != nil {
						t.Fatal(err)
					}
					for _, z := range [][2]int64{{30000, 10001}, {50001, 7000}, {plen - 8192, 8192}} {
						if !bytes.Equal(got[z[0]:z[0]+z[1]], make([]byte, z[1])) {
							t.Errorf("[%d,+%d) not zero after write-zeroes", z[0], z[1])
						}
					}
					// Trim is advisory: its range is either kept or zero, and
					// the bytes around each operation are kept.
					for _, k := range [][2]int64{{0, 1000}, {40001, 10000}, {57001, plen - 8192 - 57001}} {
						if !bytes.Equal(got[k[0]:k[0]+k[1]], bytes.Repeat([]byte{0xaa}, int(k[1]))) {
							t.Errorf("[%d,+%d) changed", k[0], k[1])
						}
					}
					raw, err := os.ReadFile(file)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(raw[:base], bytes.Repeat([]byte{0xaa}, int(base))) {
						t.Error("the partition before was touched")
					}
					if !bytes.Equal(raw[base+plen:], bytes.Repeat([]byte{0xaa}, int(size-base-plen))) {
						t.Error("the partition after was touched")
					}
				})
			}
		}
	}
}

// TestBlockDeviceCapabilities: a block device is served with trim and
// reports its whole range as data.
func TestBlockDeviceCapabilities(t *testing.T) {
	dev := loopdevtest.Attach(t, filledFile(t, 1<<20, 0))
	b, err := OpenFile(dev, FileOptions{Offset: 64 << 10, Length: 512 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.blockDev {
		t.Fatal("a loop device not recognised as a block device")
	}
	ex, err := b.Extents(0, 512<<10)
	if err != nil || len(ex) != 1 || ex[0] != (Extent{Length: 512 << 10}) {
		t.Fatalf("extents %v, %v: want one data extent", ex, err)
	}
	_, addr := startServer(t, Export{Name: testName, Backend: b})
	c := dial(t, addr, testName)
	if c.Flags()&FlagSendTrim == 0 {
		t.Fatal("block device export without trim")
	}
	if err := c.Trim(0, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteZeroes(0, 64<<10, false); err != nil {
		t.Fatal(err)
	}
}
