package testcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
)

// extent is one line of `nbdinfo --map`.
type extent struct {
	off, n int64
	desc   string
}

// nbdinfoMap runs `nbdinfo --map` on uri and returns its extents, with
// neighbours of the same kind merged.
func nbdinfoMap(ctx context.Context, t *testing.T, nbdinfo, uri string) []extent {
	t.Helper()
	out, err := exec.CommandContext(ctx, nbdinfo, "--map", uri).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdinfo --map: %v\n%s", err, out)
	}
	var exts []extent
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("nbdinfo --map line %q", line)
		}
		off, err1 := strconv.ParseInt(f[0], 10, 64)
		n, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("nbdinfo --map line %q", line)
		}
		if k := len(exts) - 1; k >= 0 && exts[k].desc == f[3] && exts[k].off+exts[k].n == off {
			exts[k].n += n
			continue
		}
		exts = append(exts, extent{off, n, f[3]})
	}
	return exts
}

// mapOf describes the data ranges of a volume of size bytes as extents of
// "data" and "hole,zero".
func mapOf(size int64, data ...[2]int64) []extent {
	var out []extent
	pos := int64(0)
	for _, d := range data {
		if d[0] > pos {
			out = append(out, extent{pos, d[0] - pos, "hole,zero"})
		}
		out = append(out, extent{d[0], d[1], "data"})
		pos = d[0] + d[1]
	}
	if pos < size {
		out = append(out, extent{pos, size - pos, "hole,zero"})
	}
	return out
}

func equalExtents(a, b []extent) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLeaseTrimAndMap: through a dedicated lease (a whole device), a
// shared lease with bandwidth and IOPS caps, and a composed volume, nbdinfo
// sees trim, write-zeroes, FUA and flush offered and maps a fresh lease as
// one hole that reads as zeroes; after a write, exactly the written range
// is data.
func TestLeaseTrimAndMap(t *testing.T) {
	t.Parallel()
	nbdinfo, err := exec.LookPath("nbdinfo")
	if err != nil {
		t.Skip("nbdinfo not installed")
	}
	c := Start(t, Options{Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20},
		{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 4 << 20},
	}})
	ctx := ctxT(t)
	dedicated := createBlock(t, c.Client(), 4<<20, api.ModeDedicated)
	shared, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 8 << 20,
		BandwidthCap: 1 << 30, IOPSCap: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	composed, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 12 << 20})
	if err != nil {
		t.Fatal(err)
	}
	att, err := stripe.Attach(ctx, stripe.AttachConfig{URIs: partURIs(composed), StripeUnit: composed.StripeUnit})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()

	for _, tc := range []struct {
		name string
		uri  string
		size int64
	}{
		{"dedicated", dedicated.URI, dedicated.Parts[0].Length}, // a whole device, whichever
		{"shared with caps", shared.URI, 8 << 20},
		{"composed", att.URI(), 12 << 20},
	} {
		// nbdinfo --can X exits 0 when the export offers X, 2 when not.
		for _, can := range []string{"trim", "zero", "fua", "flush"} {
			if out, err := exec.CommandContext(ctx, nbdinfo, "--can", can, tc.uri).CombinedOutput(); err != nil {
				t.Errorf("%s: nbdinfo --can %s: %v %s", tc.name, can, err, out)
			}
		}
		if got, want := nbdinfoMap(ctx, t, nbdinfo, tc.uri), mapOf(tc.size); !equalExtents(got, want) {
			t.Errorf("%s: fresh lease maps as %v, want %v", tc.name, got, want)
		}
		nc, err := nbd.DialURI(ctx, tc.uri)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.WriteAtContext(ctx, bytes.Repeat([]byte{1}, 1<<20), 2<<20, true); err != nil {
			t.Fatal(err)
		}
		nc.Close()
		if got, want := nbdinfoMap(ctx, t, nbdinfo, tc.uri), mapOf(tc.size, [2]int64{2 << 20, 1 << 20}); !equalExtents(got, want) {
			t.Errorf("%s: after a 1 MiB write maps as %v, want %v", tc.name, got, want)
		}
	}
}

// allocated is the bytes a file has allocated on disk.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestNbdcopySparseThroughComposedLease: nbdcopy of a sparse 1 GiB image
// (4 MiB of data) into a 3-way composed lease keeps the holes: the
// volume's block status (nbdinfo --map, passed through by the stripe from
// the lenders' partitions) shows data exactly where the source has it,
// and the lenders' backing files hold little more than the data: nbdcopy
// skipped the holes (or had them zeroed, which punches holes) instead of
// writing zeroes. Copied back out, the image is identical and as sparse.
func TestNbdcopySparseThroughComposedLease(t *testing.T) {
	t.Parallel()
	nbdcopy, err1 := exec.LookPath("nbdcopy")
	nbdinfo, err2 := exec.LookPath("nbdinfo")
	if err1 != nil || err2 != nil {
		t.Skip("nbdcopy or nbdinfo not installed")
	}
	const size = 1 << 30
	c := Start(t, Options{Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 400 << 20}}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	att, err := stripe.Attach(ctx, stripe.AttachConfig{URIs: partURIs(l), StripeUnit: l.StripeUnit})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	vsize := att.Volume().Size()

	dir := t.TempDir()
	src := filepath.Join(dir, "sparse.img")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	data := [][2]int64{{0, 1 << 20}, {300 << 20, 2 << 20}, {size - 1<<20, 1 << 20}}
	for _, d := range data {
		b := make([]byte, d[1])
		rand.Read(b)
		if _, err := f.WriteAt(b, d[0]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if out, err := exec.CommandContext(ctx, nbdcopy, src, att.URI()).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy in: %v\n%s", err, out)
	}
	if got, want := nbdinfoMap(ctx, t, nbdinfo, att.URI()), mapOf(vsize, data...); !equalExtents(got, want) {
		t.Fatalf("the composed volume maps as %v, want %v", got, want)
	}
	var lent int64
	for _, n := range lenders(c, l) {
		lent += allocated(t, filepath.Join(n.StateDir, "disk0.img"))
	}
	if lent > 8<<20 {
		t.Errorf("the lenders' files hold %d bytes for 4 MiB of data: holes were written", lent)
	}

	dst := filepath.Join(dir, "copy.img")
	if out, err := exec.CommandContext(ctx, nbdcopy, att.URI(), dst).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy out: %v\n%s", err, out)
	}
	if err := os.Truncate(dst, size); err != nil { // the volume may be a little larger
		t.Fatal(err)
	}
	if got := allocated(t, dst); got > 8<<20 {
		t.Errorf("the copy holds %d bytes for 4 MiB of data", got)
	}
	// The copy's allocated ranges (the rest reads as zeroes) and the
	// source's data ranges hold the same bytes.
	ranges := append(dataRanges(t, dst), data...)
	for _, r := range ranges {
		if !bytes.Equal(readRange(t, dst, r), readRange(t, src, r)) {
			t.Fatalf("the copy differs from the source in [%d,+%d)", r[0], r[1])
		}
	}
}

// dataRanges lists a file's allocated ranges (SEEK_DATA, SEEK_HOLE).
func dataRanges(t *testing.T, p string) [][2]int64 {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const seekData, seekHole = 3, 4
	var out [][2]int64
	for pos := int64(0); ; {
		d, err := f.Seek(pos, seekData)
		if err != nil {
			return out // ENXIO: no data after pos
		}
		h, err := f.Seek(d, seekHole)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, [2]int64{d, h - d})
		pos = h
	}
}

func readRange(t *testing.T, p string, r [2]int64) []byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, r[1])
	if _, err := f.ReadAt(b, r[0]); err != nil {
		t.Fatal(err)
	}
	return b
}
