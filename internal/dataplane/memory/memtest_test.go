package memory

import (
	"context"
	"testing"
)

func TestMemtest(t *testing.T) {
	_, addr := startChildDonor(t, 4<<20)
	c := dial(t, addr, Options{})
	steps, err := Memtest(context.Background(), c, 1<<20)
	for _, s := range steps {
		t.Logf("%s: %d bytes in %v %s", s.Name, s.Bytes, s.Duration, s.Skipped)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 5 {
		t.Fatalf("%d steps", len(steps))
	}
}

func TestPattern(t *testing.T) {
	a := make([]byte, 1000)
	pattern(a, 0, 7)
	b := make([]byte, 990)
	pattern(b, 10, 7)
	if string(a[10:]) != string(b) {
		t.Fatal("pattern depends on where the buffer starts")
	}
}
