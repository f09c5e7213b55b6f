package stripe

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// barrier releases the FLUSHes of n lenders only once all n have arrived,
// and fails them if they do not all come within a deadline: flushes sent
// one after another, each awaited before the next, never meet.
type barrier struct {
	mu   sync.Mutex
	n    int
	all  chan struct{}
	fail map[*barrierBackend]error
}

func newBarrier(n int) *barrier {
	return &barrier{n: n, all: make(chan struct{}), fail: map[*barrierBackend]error{}}
}

type barrierBackend struct {
	*countingBackend
	b *barrier
}

var errFlushFailed = errors.New("test: flush failed")

func (bb *barrierBackend) Flush() error {
	bb.flushes.Add(1)
	bb.b.mu.Lock()
	bb.b.n--
	if bb.b.n == 0 {
		close(bb.b.all)
	}
	err, all := bb.b.fail[bb], bb.b.all
	bb.b.mu.Unlock()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		return errors.New("test: the other parts' flushes never came")
	}
	return err
}

// TestFlushPipelined: a volume's flush of several parts is sent to every
// part before any is awaited (Volume.flushPipelined), from the caller's
// goroutine; a part whose flush fails fails the volume's flush, while the
// others' count as flushed, so that the next flush goes to the failed
// part only.
func TestFlushPipelined(t *testing.T) {
	const unit = 64 << 10
	b := newBarrier(3)
	var bes []*barrierBackend
	var uris []string
	for range 3 {
		be := &barrierBackend{countingBackend: &countingBackend{MemBackend: nbd.NewMemBackend(1 << 20), multiConn: true}, b: b}
		bes = append(bes, be)
		uris = append(uris, startLenderWith(t, be).uri)
	}
	a := attach(t, AttachConfig{URIs: uris, StripeUnit: unit, ConnsPerPart: 2})
	v := a.Volume()
	if !v.pipelined([]chunk{{dev: 0}, {dev: 1}, {dev: 2}}) {
		t.Fatal("an attached volume's parts do not pipeline their flushes")
	}
	b.mu.Lock()
	b.fail[bes[1]] = errFlushFailed
	b.mu.Unlock()
	for i := range 3 { // a write on every part
		if _, err := v.WriteAt([]byte{byte(i + 1)}, int64(i)*unit); err != nil {
			t.Fatal(err)
		}
	}
	err := v.Flush()
	if err == nil || !strings.Contains(err.Error(), "device 1") {
		t.Fatalf("Flush with part 1 failing: %v", err)
	}
	// Part 1's pool, its one flush failing, flushes each of its two
	// connections in turn (Pool.flushEach).
	for i, want := range []int64{1, 3, 1} {
		if got := bes[i].flushes.Load(); got != want {
			t.Errorf("part %d served %d FLUSHes, want %d", i, got, want)
		}
	}
	// Only part 1 still owes a flush.
	b.mu.Lock()
	b.n, b.all, b.fail = 1, make(chan struct{}), map[*barrierBackend]error{}
	b.mu.Unlock()
	if err := v.Flush(); err != nil {
		t.Fatalf("second Flush: %v", err)
	}
	for i, want := range []int64{1, 4, 1} {
		if got := bes[i].flushes.Load(); got != want {
			t.Errorf("after the second flush part %d served %d FLUSHes, want %d", i, got, want)
		}
	}
}
