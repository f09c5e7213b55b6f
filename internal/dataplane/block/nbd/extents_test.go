package nbd

import "testing"

// TestClientExtents: the client negotiates base:allocation and reports the
// server's holes and data; without structured replies it reports all data.
func TestClientExtents(t *testing.T) {
	p := tempFile(t, 4<<20)
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, addr := startServer(t, Export{Name: testName, Backend: b})
	c := dial(t, addr, testName)
	if !c.CanExtents() {
		t.Fatal("base:allocation not negotiated")
	}
	if _, err := c.WriteAt(make([]byte, 128<<10), 1<<20); err != nil {
		t.Fatal(err)
	}
	ext, err := c.Extents(0, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := []Extent{{Length: 1 << 20, Flags: StateHole | StateZero}, {Length: 128 << 10}, {Length: 3<<20 - 128<<10, Flags: StateHole | StateZero}}
	if len(ext) != len(want) {
		t.Fatalf("extents %v, want %v", ext, want)
	}
	for i := range want {
		if ext[i] != want[i] {
			t.Fatalf("extents %v, want %v", ext, want)
		}
	}
	simple := dial(t, addr, testName, WithoutStructuredReplies())
	if ext, err := simple.Extents(4096, 8192); err != nil || len(ext) != 1 || ext[0] != (Extent{Length: 8192}) {
		t.Fatalf("without structured replies: %v, %v", ext, err)
	}
}
