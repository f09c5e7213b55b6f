package mapping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/dataplane/memory/uffd"
)

func mapOrSkip(t *testing.T, c *client.Client, opts Options) *Mapping {
	t.Helper()
	m, err := Map(context.Background(), c, opts)
	if errors.Is(err, ErrUffdUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMappingEvictionAndWriteBack(t *testing.T) {
	const size = 4 << 20
	// The donor runs in another process, as in production: an in-process
	// donor would need a scheduler P that the faulting goroutine holds.
	_, addr := memorytest.StartChild(t, size)
	c := dial(t, addr, client.Options{})
	ctx := context.Background()
	// Seed the region through an explicit channel.
	shadow := make([]byte, size)
	_, _ = rand.NewChaCha8([32]byte{3}).Read(shadow)
	if err := c.Write(ctx, client.ChannelBulk, shadow, 0); err != nil {
		t.Fatal(err)
	}
	m := mapOrSkip(t, c, Options{}) // cache: 10% of the region
	b := m.Bytes()
	if len(b) != size {
		t.Fatalf("mapping of %d bytes", len(b))
	}
	// Sequential read of everything, then random read-modify-writes.
	if !bytes.Equal(b, shadow) {
		t.Fatal("sequential read differs")
	}
	// A sequential scan evicts runs of contiguous pages, each with one
	// punch (a readahead window evicts up to a window of pages).
	if st := m.Stats(); st.Evictions == 0 || st.Evictions < 8*st.Punches {
		t.Fatalf("sequential scan: %d pages evicted with %d punches", st.Evictions, st.Punches)
	}
	rng := rand.New(rand.NewPCG(4, 5))
	for range 4000 {
		off := rng.IntN(size - 8)
		v := binary.LittleEndian.Uint64(b[off:]) + uint64(off)
		binary.LittleEndian.PutUint64(b[off:], v)
		binary.LittleEndian.PutUint64(shadow[off:], binary.LittleEndian.Uint64(shadow[off:])+uint64(off))
	}
	for range 2000 {
		off := rng.IntN(size - 8)
		if !bytes.Equal(b[off:off+8], shadow[off:off+8]) {
			t.Fatalf("random read at %d differs", off)
		}
	}
	st := m.Stats()
	if st.Evictions == 0 || st.WriteBacks == 0 || st.FaultWriteBacks == 0 || st.Resident > st.CachePages || st.CachePages != size/10/4096 {
		t.Fatalf("stats %+v", st)
	}
	if st.PagesIn <= st.Faults {
		t.Fatalf("no readahead: %d pages in %d faults", st.PagesIn, st.Faults)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := c.Read(ctx, client.ChannelBulk, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, shadow) {
		t.Fatal("donor does not hold the written-back data")
	}
}

// A program uses the mapping as ordinary memory: it sorts 256 Ki uint32
// living in remote memory with a local cache of 10%.
func TestMappingSortProgram(t *testing.T) {
	const n = 1 << 18
	_, addr := memorytest.StartChild(t, n*4)
	c := dial(t, addr, client.Options{})
	m := mapOrSkip(t, c, Options{})
	xs := unsafe.Slice((*uint32)(unsafe.Pointer(&m.Bytes()[0])), n)
	rng := rand.New(rand.NewPCG(6, 7))
	var sum uint64
	for i := range xs {
		xs[i] = rng.Uint32()
		sum += uint64(xs[i])
	}
	slices.Sort(xs)
	var sum2 uint64
	for i := range xs {
		if i > 0 && xs[i] < xs[i-1] {
			t.Fatalf("not sorted at %d", i)
		}
		sum2 += uint64(xs[i])
	}
	if sum != sum2 {
		t.Fatal("checksum changed")
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, n*4)
	if err := c.Read(context.Background(), client.ChannelBulk, raw, 0); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		if binary.NativeEndian.Uint32(raw[4*i:]) < binary.NativeEndian.Uint32(raw[4*i-4:]) {
			t.Fatalf("donor copy not sorted at %d", i)
		}
	}
	st := m.Stats()
	t.Logf("faults %d wp %d pages in %d evictions %d write-backs %d", st.Faults, st.WPFaults, st.PagesIn, st.Evictions, st.WriteBacks)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestMapUnavailable(t *testing.T) {
	old := openUffd
	openUffd = func(uint64) (*uffd.FD, error) { return nil, uffd.ErrUnavailable }
	defer func() { openUffd = old }()
	td := memorytest.Start(t, 1<<20, 0)
	c := dial(t, td.Addr, client.Options{})
	if _, err := Map(context.Background(), c, Options{}); !errors.Is(err, ErrUffdUnavailable) {
		t.Fatalf("Map: %v", err)
	}
	if err := c.Write(context.Background(), client.ChannelSync, []byte("still works"), 0); err != nil {
		t.Fatal(err)
	}
}

// Several goroutines use one mapping at once, each on its own stripe, while
// the cache is far smaller than the data.
func TestMappingConcurrentUsers(t *testing.T) {
	const size, users = 4 << 20, 4
	_, addr := memorytest.StartChild(t, size)
	c := dial(t, addr, client.Options{})
	m := mapOrSkip(t, c, Options{})
	b := m.Bytes()
	part := size / users
	var wg sync.WaitGroup
	errs := make(chan error, users)
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := b[u*part : (u+1)*part]
			shadow := make([]byte, part)
			rng := rand.New(rand.NewPCG(uint64(u), 11))
			for range 1000 {
				off := rng.IntN(part - 8)
				v := byte(rng.Uint32())
				mine[off] = v
				shadow[off] = v
				if r := rng.IntN(part); mine[r] != shadow[r] {
					errs <- fmt.Errorf("user %d: byte %d differs", u, r)
					return
				}
			}
			if !bytes.Equal(mine, shadow) {
				errs <- fmt.Errorf("user %d: stripe differs", u)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// A donor killed while the mapping is in use: the next fault neither hangs
// nor returns made-up data; it faults, and Err says why.
func TestMappingDonorKilled(t *testing.T) {
	cmd, addr := memorytest.StartChild(t, 4<<20)
	c := dial(t, addr, client.Options{Timeout: time.Second})
	m := mapOrSkip(t, c, Options{})
	b := m.Bytes()
	sinkByte = b[0]
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	func() {
		defer func() {
			r := recover()
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				t.Errorf("touch after donor death: recovered %v, want a memory fault", r)
			}
		}()
		sinkByte = b[2<<20]
		t.Error("read of an unfetched page succeeded after the donor died")
	}()
	if err := m.Err(); !errors.Is(err, ErrMappingFailed) || !errors.Is(err, protocol.ErrDonorLost) {
		t.Fatalf("Err: %v", err)
	}
	if err := m.Close(); err == nil {
		t.Fatal("Close after donor death returned nil")
	}
}

var sinkByte byte

// Reading never writes anything back, and read-modify-write patterns switch
// the mapping to installing pages writable (one fault per page, not two).
func TestMappingCleanPagesStayClean(t *testing.T) {
	_, addr := memorytest.StartChild(t, 4<<20)
	c := dial(t, addr, client.Options{})
	m := mapOrSkip(t, c, Options{Readahead: 1})
	b := m.Bytes()
	rng := rand.New(rand.NewPCG(12, 13))
	pages := len(b) / 4096
	for range 3000 {
		sinkByte += b[rng.IntN(pages)*4096]
	}
	st := m.Stats()
	if st.WriteBacks != 0 || st.PreDirtied != 0 || st.WPFaults != 0 || st.Evictions == 0 {
		t.Fatalf("read-only pass: %+v", st)
	}
	m.ResetStats()
	for range 3000 {
		b[rng.IntN(pages)*4096+1]++
	}
	st = m.Stats()
	if st.PreDirtied == 0 || st.WPFaults*2 > st.Faults {
		t.Fatalf("read-modify-write pass: %d faults, %d write-protect faults, %d pre-dirtied", st.Faults, st.WPFaults, st.PreDirtied)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// A handler binary that does not call RunFaultHandlerIfChild is reported,
// and the client keeps working.
func TestMapHandlerNotHooked(t *testing.T) {
	td := memorytest.Start(t, 1<<20, 0)
	c := dial(t, td.Addr, client.Options{})
	_, err := Map(context.Background(), c, Options{HandlerPath: "/bin/true"})
	if errors.Is(err, ErrUffdUnavailable) {
		t.Skip(err)
	}
	if err == nil || !strings.Contains(err.Error(), "RunFaultHandlerIfChild") {
		t.Fatalf("Map with an unhooked handler binary: %v", err)
	}
	if err := c.Write(context.Background(), client.ChannelSync, []byte("still works"), 0); err != nil {
		t.Fatal(err)
	}
}

// TestMappingWriteEstimateFollowsPattern: after a read-only pass has filled
// a cache much larger than probeHorizon, a read-modify-write pass gets its
// pages installed writable (one fault each instead of two) within about
// probeHorizon faults, not after a whole cache's worth of evictions of the
// read pass's pages.
func TestMappingWriteEstimateFollowsPattern(t *testing.T) {
	const size = 64 << 20
	_, addr := memorytest.StartChild(t, size)
	c := dial(t, addr, client.Options{})
	m := mapOrSkip(t, c, Options{Readahead: 1})
	b := m.Bytes()
	rng := rand.New(rand.NewPCG(21, 22))
	pages := len(b) / 4096
	st := m.Stats()
	for range st.CachePages * 3 / 2 {
		sinkByte += b[rng.IntN(pages)*4096]
	}
	if st.CachePages < 4*probeHorizon {
		t.Fatalf("cache of %d pages: the test needs one much larger than the horizon (%d)", st.CachePages, probeHorizon)
	}
	m.ResetStats()
	const n = 2000
	for range n {
		b[rng.IntN(pages)*4096+1]++
	}
	st = m.Stats()
	if st.PreDirtied < n/2 {
		t.Fatalf("read-modify-write pass: %d of %d faults installed writable (%d write-protect faults)", st.PreDirtied, st.Faults, st.WPFaults)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// The fault handler process is outside the program's process group, so an
// interrupt from the terminal (sent to the foreground group) leaves the
// mapping working while the program handles it.
func TestMappingHandlerOutsideProcessGroup(t *testing.T) {
	_, addr := memorytest.StartChild(t, 1<<20)
	m := mapOrSkip(t, dial(t, addr, client.Options{}), Options{})
	defer m.Close()
	pg, err := syscall.Getpgid(m.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if pg == syscall.Getpgrp() {
		t.Fatalf("handler in the program's process group %d", pg)
	}
}

// Threads that fault at the same time have their pages fetched together:
// with the handler process stopped, four threads fault on four pages; once
// it resumes it reads the four messages at once and sends their READs in
// one write (faultBatch).
func TestMappingBatchesConcurrentFaults(t *testing.T) {
	const threads = 4
	m, want, resume := stoppedMapping(t, threads)
	page := func(k int) int { return (k*37 + 5) * 4096 } // distinct, not neighbours
	tc := touches{b: m.Bytes(), want: want}
	for k := range threads {
		tc.touch(t, page(k))
	}
	waitFaultWaiters(t, threads, resume)
	resume()
	tc.wait()
	// A waiting thread can be interrupted by the runtime's preemption
	// signal and fault again just as the handler reads: most, not always
	// all, of the faults arrive together.
	if st := m.Stats(); st.Faults != threads || st.Batched < 2 {
		t.Fatalf("%d faults, %d of them batched; want %d, batched", st.Faults, st.Batched, threads)
	}
}

// More threads fault at once than a batch takes (maxBatch), the later ones
// on pages of the first batch: the first batch is served before the next
// one starts, so no page is installed twice (UFFDIO_COPY would fail with
// EEXIST and fail the mapping).
func TestMappingBatchOverflow(t *testing.T) {
	m, want, resume := stoppedMapping(t, 2*maxBatch)
	page := func(k int) int { return (k*7 + 5) * 4096 }
	tc := touches{b: m.Bytes(), want: want}
	for k := range maxBatch {
		tc.touch(t, page(k))
	}
	waitFaultWaiters(t, maxBatch, resume)
	for k := range maxBatch { // the same pages again, after a full batch
		tc.touch(t, page(k)+8)
	}
	waitFaultWaiters(t, 2*maxBatch, resume)
	resume()
	tc.wait()
	if err := m.Err(); err != nil {
		t.Fatalf("mapping failed: %v", err)
	}
}

// stoppedMapping maps a 1 MiB region of random bytes (returned) for up to
// threads threads waiting on faults at once, and stops the fault handler
// process. resume continues it (once; also at cleanup).
func stoppedMapping(t *testing.T, threads int) (*Mapping, []byte, func()) {
	const size = 1 << 20
	_, addr := memorytest.StartChild(t, size)
	c := dial(t, addr, client.Options{})
	want := make([]byte, size)
	_, _ = rand.NewChaCha8([32]byte{7}).Read(want)
	if err := c.Write(context.Background(), client.ChannelBulk, want, 0); err != nil {
		t.Fatal(err)
	}
	m := mapOrSkip(t, c, Options{})
	t.Cleanup(func() { _ = m.Close() })
	// A thread waiting on a fault keeps its P, and a collection would wait
	// for it while the handler is stopped.
	procs := runtime.GOMAXPROCS(threads + 2)
	t.Cleanup(func() { runtime.GOMAXPROCS(procs) })
	gc := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(gc) })
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	return m, want, resume
}

// touches reads bytes of a mapping from threads of their own, checking
// them against want; a thread whose read faults (SIGBUS) reports it.
type touches struct {
	b, want []byte
	wg      sync.WaitGroup
}

func (tc *touches) touch(t *testing.T, off int) {
	tc.wg.Add(1)
	go func() {
		defer tc.wg.Done()
		debug.SetPanicOnFault(true)
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("read at %d: %v", off, r)
			}
		}()
		if got := tc.b[off]; got != tc.want[off] {
			t.Errorf("read %#x at %d, want %#x", got, off, tc.want[off])
		}
	}()
}

func (tc *touches) wait() { tc.wg.Wait() }

// waitFaultWaiters waits until n threads of this process wait on a
// userfaultfd fault (resuming the handler before failing).
func waitFaultWaiters(t *testing.T, n int, resume func()) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); faultWaiters(t) < n; {
		if time.Now().After(deadline) {
			resume()
			t.Fatalf("%d of %d threads wait on a fault", faultWaiters(t), n)
		}
		runtime.Gosched()
	}
}

// faultWaiters counts this process's threads blocked on a userfaultfd fault.
func faultWaiters(t *testing.T) int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, task := range tasks {
		w, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/wchan")
		if string(w) == "handle_userfault" {
			n++
		}
	}
	return n
}
