package stripe

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestPartGivenUpDuringOutageTriedAgain: a part whose lender and the
// resolver of its URI (the control plane) stay unreachable for longer
// than the redial is given up, but not for good: requests fail
// meanwhile, the failures to resolve its URI are logged once with their
// cause and then summed up, and once both are back the part is reached
// again and reads find what was written before.
func TestPartGivenUpDuringOutageTriedAgain(t *testing.T) {
	const part = 4 << 20
	l := startLender(t, part)
	var down atomic.Bool
	var asked atomic.Int64
	resolve := func(context.Context, int) (string, error) {
		asked.Add(1)
		if down.Load() {
			return "", errors.New("control plane unreachable")
		}
		return l.uri, nil
	}
	log, logs := logtest.Logger(nil)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, Resolve: resolve, ConnsPerPart: 1,
		RequestTimeout: 10 * time.Second, RedialTimeout: 300 * time.Millisecond, Logger: log})
	u, _ := nbd.ParseURI(a.URI())
	c, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := bytes.Repeat([]byte("written before the outage "), 200)[:4096]
	if _, err := c.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	down.Store(true)
	l.kill()
	got := make([]byte, len(want))
	if _, err := c.ReadAt(got, 0); err == nil {
		t.Fatal("a read succeeded with the lender down")
	}
	if !strings.Contains(logs.String(), "gave up reconnecting to part") {
		t.Fatalf("the part not given up:\n%s", logs)
	}
	// Many resolves fail (the redial's, then the background attempts'):
	// one line says so with its cause.
	waitFor(t, "the part's URI asked for again in the background", func() bool { return asked.Load() >= 8 })
	if _, err := c.ReadAt(got, 0); err == nil {
		t.Fatal("a read succeeded with the lender down")
	}
	if n := len(logs.Lines("could not resolve part's URI")); n != 1 {
		t.Errorf("%d log lines of the failures to resolve the part's URI, want 1:\n%s", n, logs)
	}

	l.restart(t)
	down.Store(false)
	waitFor(t, "a read once the lender and the resolver are back", func() bool {
		_, err := c.ReadAt(got, 0)
		return err == nil
	})
	if !bytes.Equal(got, want) {
		t.Errorf("read %q after the outage, wrote %q", got[:32], want[:32])
	}
	if len(logs.Lines("more failures to resolve part's URI since")) != 1 {
		t.Errorf("the failures to resolve the part's URI not summed up once it answered:\n%s", logs)
	}
	if f := a.Volume().Failed(); len(f) != 0 {
		t.Errorf("Failed() = %v after the outage", f)
	}
	if _, err := c.WriteAt(want, 8192); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Errorf("flush after the outage: %v", err)
	}
}
