package stripe

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/logtest"
)

// TestWriteBackFailuresLogBounded: a lender failing every write (out of
// space, as a full lender does) fails every acknowledged write; the log
// gets the first failure at ERROR with its cause, then one summary line
// per failSummaryEvery and one at the FLUSH that reports them, with the
// right counts, not a line per write (an nbdcopy of 128 MiB onto a full
// lender logged 320). A FLUSH that finds no failure ends the run: the
// next failure is logged with its cause again.
func TestWriteBackFailuresLogBounded(t *testing.T) {
	log, logs := logtest.Logger(nil)
	m := newGatedMem(4 << 20)
	l := startLenderWith(t, m)
	a := attach(t, AttachConfig{URIs: []string{l.uri}, WriteBack: true, Logger: log})
	c := dialAttachment(t, a)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	a.wb.mu.Lock()
	a.wb.flog.clk = fake
	a.wb.mu.Unlock()

	// fail makes n plain writes (at distinct offsets from off) that are
	// acknowledged, then failed by the lender.
	fail := func(off int64, n int) {
		t.Helper()
		m.fail.Store(true)
		early := a.wb.early.Load()
		rel := m.hold(t)
		for i := range n {
			if _, err := c.WriteAt(pattern(4096, 1), off+int64(i)*4096); err != nil {
				t.Fatalf("plain write: %v (it is acknowledged before the lender answers)", err)
			}
		}
		if k := a.wb.early.Load() - early; k != uint64(n) {
			t.Fatalf("%d writes acknowledged early, want %d", k, n)
		}
		rel()
		waitFor(t, "the lender's answers", func() bool { k, _ := a.wb.state(); return k == 0 })
		m.fail.Store(false)
	}
	expect := func(what string, want ...string) {
		t.Helper()
		got := logs.Lines("level=ERROR")
		if len(got) != len(want) {
			t.Fatalf("%s: %d ERROR lines, want %d:\n%s", what, len(got), len(want), strings.Join(got, "\n"))
		}
		for i, w := range want {
			if !strings.Contains(got[i], w) {
				t.Fatalf("%s: ERROR line %d is\n%s\nwant it to say %q", what, i, got[i], w)
			}
		}
	}
	first := "an acknowledged write failed; the next flush reports it"

	fail(0, 100)
	expect("100 failures", first)
	if !strings.Contains(logs.Lines("level=ERROR")[0], "server error EIO") {
		t.Fatalf("the first failure's line lacks its cause: %s", logs.Lines("level=ERROR")[0])
	}
	fake.Advance(failSummaryEvery)
	fail(100*4096, 1)
	expect("a failure failSummaryEvery later", first, "100 more acknowledged writes failed since 2026-01-02T03:04:05Z")
	fail(200*4096, 50)
	expect("50 more before a FLUSH", first, "100 more")
	var ne *nbd.Error
	if err := c.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Fatalf("flush after failed acknowledged writes: %v, want EIO", err)
	}
	expect("the FLUSH", first, "100 more", "50 more acknowledged writes failed since")
	if !strings.Contains(logs.Lines("level=ERROR")[2], "failed=50") || !strings.Contains(logs.Lines("level=ERROR")[2], "err=") {
		t.Fatalf("the summary lacks its count or cause: %s", logs.Lines("level=ERROR")[2])
	}

	// A clean FLUSH ends the run.
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	fail(0, 3)
	expect("a new run", first, "100 more", "50 more", first)
	if err := a.Close(); !errors.Is(err, ErrWriteBack) {
		t.Fatalf("close: %v, want ErrWriteBack", err)
	}
	expect("close", first, "100 more", "50 more", first, "2 more acknowledged writes failed since")
}
