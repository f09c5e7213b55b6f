package stripe

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// extDev is a memDev with a 4 KiB-granular allocation map; its Extents
// answers at most maxRuns runs, to exercise short answers.
type extDev struct {
	*memDev
	alloc   []bool // per 4 KiB block
	maxRuns int
}

func (e extDev) Extents(off, n int64) ([]nbd.Extent, error) {
	var out []nbd.Extent
	for pos := off; pos < off+n && len(out) < e.maxRuns; {
		a := e.alloc[pos/4096]
		end := pos
		for end < off+n && e.alloc[end/4096] == a {
			end = min((end/4096+1)*4096, off+n)
		}
		var fl uint32
		if !a {
			fl = nbd.StateHole | nbd.StateZero
		}
		out = append(out, nbd.Extent{Length: end - pos, Flags: fl})
		pos = end
	}
	return out, nil
}

// TestVolumeExtents checks block status through the layout against each
// device's allocation map, with short device answers and odd ranges.
func TestVolumeExtents(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, ndev := range []int{1, 2, 3} {
		for _, unit := range []int64{4 << 10, 64 << 10} {
			const size = 1 << 20
			devs := make([]Device, ndev)
			exts := make([]extDev, ndev)
			for i := range devs {
				e := extDev{memDev: newMem(size), alloc: make([]bool, size/4096), maxRuns: 1 + r.IntN(6)}
				for b := range e.alloc {
					e.alloc[b] = r.IntN(3) == 0
				}
				exts[i], devs[i] = e, e
			}
			v, err := New(devs, Config{StripeUnit: unit})
			if err != nil {
				t.Fatal(err)
			}
			if !v.CanExtents() {
				t.Fatal("CanExtents false over extent-capable devices")
			}
			for range 200 {
				off := r.Int64N(v.Size()/4096) * 4096
				n := 4096 * (1 + r.Int64N((v.Size()-off)/4096))
				got, err := v.Extents(off, n)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) == 0 {
					t.Fatalf("no extents for [%d,+%d)", off, n)
				}
				pos := off
				for _, x := range got {
					if x.Length <= 0 || x.Length%4096 != 0 {
						t.Fatalf("extent %v", x)
					}
					for b := pos; b < pos+x.Length; b += 4096 {
						d, doff := v.locate(b)
						hole := !exts[d].alloc[doff/4096]
						if hole != (x.Flags != 0) {
							t.Fatalf("ndev=%d unit=%d: byte %d reported flags %d, hole=%v", ndev, unit, b, x.Flags, hole)
						}
					}
					pos += x.Length
				}
				if pos > off+n {
					t.Fatalf("extents cover past the request: %d > %d", pos, off+n)
				}
			}
		}
	}
	// A device without Extents makes the volume report all data.
	v, err := New([]Device{newMem(1 << 20), extDev{memDev: newMem(1 << 20), alloc: make([]bool, 256), maxRuns: 9}}, Config{StripeUnit: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := v.Extents(4096, 1<<20); err != nil || v.CanExtents() || len(got) != 1 || got[0] != (nbd.Extent{Length: 1 << 20}) {
		t.Fatalf("without extents on every device: %v, %v", got, err)
	}
}

// TestAttachExtentsNbdinfo serves sparse files from three lenders, attaches
// them as one volume and asks nbdinfo --map for the allocation map, which
// must show data exactly where it was written.
func TestAttachExtentsNbdinfo(t *testing.T) {
	need(t, "nbdinfo")
	const part = 4 << 20
	var uris []string
	for range 3 {
		p := filepath.Join(t.TempDir(), "part.img")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, part); err != nil {
			t.Fatal(err)
		}
		b, err := nbd.OpenFile(p, nbd.FileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		uris = append(uris, startLenderWith(t, b).uri)
	}
	a := attach(t, AttachConfig{URIs: uris, StripeUnit: 64 << 10})
	if !a.Volume().CanExtents() {
		t.Fatal("volume cannot report extents")
	}
	u, _ := nbd.ParseURI(a.URI())
	c, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 64 KiB of data at volume offset 1 MiB + 64 KiB (one unit on one part).
	if _, err := c.WriteAt(bytes.Repeat([]byte{1}, 64<<10), 1<<20+64<<10); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("nbdinfo", "--map", a.URI()).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdinfo --map: %v\n%s", err, out)
	}
	var data []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "0" {
			data = append(data, f[0]+"+"+f[1])
		}
	}
	if want := fmt.Sprintf("%d+%d", 1<<20+64<<10, 64<<10); len(data) != 1 || data[0] != want {
		t.Fatalf("data extents %v, want [%s]; nbdinfo said:\n%s", data, want, out)
	}
}
