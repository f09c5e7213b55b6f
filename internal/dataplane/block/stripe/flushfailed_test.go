package stripe

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// TestFlushBesideFailedPart: a FLUSH from the client while a part has
// failed (its lender stopped answering, and a read timed out) still
// flushes every other part with acknowledged writes, so that they become
// durable, and then fails (EIO). With two parts the one healthy part is
// flushed alone; with three the two healthy ones are flushed together
// (pipelined).
func TestFlushBesideFailedPart(t *testing.T) {
	for _, parts := range []int{2, 3} {
		t.Run(fmt.Sprint(parts, " parts"), func(t *testing.T) {
			const timeout, unit = time.Second, 64 << 10
			l0 := startLender(t, 4<<20)
			bh := newBlackhole(t, l0.ln.Addr().String())
			u0, _ := nbd.ParseURI(l0.uri)
			u0.Address = bh.ln.Addr().String()
			uris := []string{u0.String()}
			var mems []*gatedMem
			for range parts - 1 {
				m := newGatedMem(4 << 20)
				mems = append(mems, m)
				uris = append(uris, startLenderWith(t, m).uri)
			}
			a := attach(t, AttachConfig{URIs: uris, StripeUnit: unit, ConnsPerPart: 1, RequestTimeout: timeout})
			c := dialAttachment(t, a)
			for i := range parts { // one write on each part
				if _, err := c.WriteAt(pattern(4096, 1), int64(i)*unit); err != nil {
					t.Fatal(err)
				}
			}
			bh.freeze() // part 0's lender vanishes
			if _, err := c.ReadAt(make([]byte, 4096), 0); err == nil {
				t.Fatal("a read from a vanished lender succeeded")
			}
			if f := a.vol.Failed(); !slices.Equal(f, []int{0}) {
				t.Fatalf("failed parts %v, want [0]", f)
			}
			err := c.Flush()
			var ne *nbd.Error
			if !errors.As(err, &ne) {
				t.Fatalf("FLUSH with a failed part: %v, want an error reply (EIO)", err)
			}
			for i, m := range mems {
				if e := m.logged(); !slices.Equal(e, []string{"write", "flush"}) {
					t.Errorf("part %d's lender saw %v after the FLUSH, want its acknowledged write, then the FLUSH's flush", i+1, e)
				}
			}
			// The healthy parts' writes were covered: Close names part 0
			// alone with ErrUnflushed, and flushes nothing again.
			cerr := a.Close()
			if !errors.Is(cerr, ErrUnflushed) || !strings.Contains(fmt.Sprint(cerr), "device 0 (1 requests") {
				t.Errorf("Close: %v, want ErrUnflushed naming device 0", cerr)
			}
			for i := 1; i < parts; i++ {
				if strings.Contains(fmt.Sprint(cerr), fmt.Sprintf("device %d (", i)) {
					t.Errorf("Close: %v, names device %d, whose write the FLUSH covered", cerr, i)
				}
			}
			for i, m := range mems {
				if e := m.logged(); !slices.Equal(e, []string{"write", "flush"}) {
					t.Errorf("part %d's lender saw %v after Close, want no flush beyond the FLUSH's", i+1, e)
				}
			}
		})
	}
}

// TestCloseNamesNoPartAFlushCovered: a FLUSH that succeeded at a part but
// reported writes its lender's restart may have lost (ErrLostWrites)
// covered what the part holds; when the part then fails, Close does not
// name the part with ErrUnflushed: no write it completed was left
// uncovered (and Close has nothing to flush).
func TestCloseNamesNoPartAFlushCovered(t *testing.T) {
	const timeout = time.Second
	l := startLender(t, 4<<20)
	bh := newBlackhole(t, l.ln.Addr().String())
	u, _ := nbd.ParseURI(l.uri)
	u.Address = bh.ln.Addr().String()
	a := attach(t, AttachConfig{URIs: []string{u.String()}, ConnsPerPart: 1, RequestTimeout: timeout})
	c := dialAttachment(t, a)
	if _, err := c.WriteAt(pattern(4096, 9), 0); err != nil {
		t.Fatal(err)
	}
	l.kill() // the connection breaks with the write unflushed
	l.restartOnSamePort(t)
	if err := c.Flush(); err == nil {
		t.Fatal("FLUSH after the lender's restart succeeded, want its report of lost writes")
	}
	bh.freeze() // then the lender vanishes
	if _, err := c.ReadAt(make([]byte, 4096), 0); err == nil {
		t.Fatal("a read from a vanished lender succeeded")
	}
	if f := a.vol.Failed(); !slices.Equal(f, []int{0}) {
		t.Fatalf("failed parts %v, want [0]", f)
	}
	err := a.Close()
	t.Logf("Close: %v", err)
	if errors.Is(err, ErrUnflushed) {
		t.Errorf("Close: %v, names a part whose every completed write the FLUSH covered", err)
	}
}
