package borrower

import (
	"context"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

func TestMemtest(t *testing.T) {
	t.Parallel()
	_, addr := memorytest.StartChild(t, 4<<20)
	c, err := client.Dial(context.Background(), addr, memorytest.Credential, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
