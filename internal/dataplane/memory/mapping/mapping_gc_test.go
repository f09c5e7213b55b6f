package mapping

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
)

const gcChildEnv = "RIALTO_MEMTEST_GC_CHILD"

// gcPattern is the initial content of page i.
func gcPattern(page []byte, i int) {
	for k := range page {
		page[k] = byte(i*7 + k/64)
	}
}

// TestMappingUnderGC touches the mapping with copy (memmove, which cannot
// be preempted while it waits on a fault) from several goroutines while
// another runs runtime.GC in a loop. With the fault handler inside the
// process, a stop-the-world phase that starts while a goroutine waits on a
// fault hangs the process; the scenario therefore runs in a child process
// under a deadline, which a hung process would miss.
func TestMappingUnderGC(t *testing.T) {
	const size = 8 << 20
	_, addr := memorytest.StartChild(t, size)
	c := dial(t, addr, client.Options{})
	seed := make([]byte, size)
	for i := range size / 4096 {
		gcPattern(seed[i*4096:(i+1)*4096], i)
	}
	if err := c.Write(context.Background(), client.ChannelBulk, seed, 0); err != nil {
		t.Fatal(err)
	}
	_ = c.Close() // single subscriber: the child opens its own session
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), gcChildEnv+"="+addr)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("faulting under a busy garbage collector did not finish within the deadline (hang): %s", out.String())
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	t.Log(strings.TrimSpace(out.String()))
}

// gcChild is the child's side of TestMappingUnderGC.
func gcChild(addr string) error {
	ctx := context.Background()
	// The parent's session ends when the donor sees its control
	// connection close, which may follow this dial: a busy region is
	// asked again until a deadline.
	var c *client.Client
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err = client.Dial(ctx, addr, memorytest.Credential, client.Options{})
		if err == nil || !errors.Is(err, protocol.ErrBusy) || time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
	}
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := Map(ctx, c, Options{})
	if errors.Is(err, ErrUffdUnavailable) {
		fmt.Println("skipped:", err)
		return nil
	}
	if err != nil {
		return err
	}
	b := m.Bytes()
	stop := make(chan struct{})
	var gcs atomic.Int64
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			runtime.GC()
			gcs.Add(1)
		}
	}()
	const workers, ops, ps = 4, 3000, 4096
	stripe := len(b) / workers / ps // pages per worker
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			shadow := make([]byte, stripe*ps)
			for i := range stripe {
				gcPattern(shadow[i*ps:(i+1)*ps], w*stripe+i)
			}
			mine := b[w*stripe*ps : (w+1)*stripe*ps]
			buf := make([]byte, ps)
			for range ops {
				p := rng.IntN(stripe)
				page, want := mine[p*ps:(p+1)*ps], shadow[p*ps:(p+1)*ps]
				if rng.IntN(2) == 0 {
					copy(buf, page) // memmove out of the mapping
					if !bytes.Equal(buf, want) {
						errs <- fmt.Errorf("worker %d: page %d differs", w, p)
						return
					}
				} else {
					for k := range buf {
						buf[k] = byte(rng.Uint32())
					}
					copy(page, buf) // memmove into the mapping
					copy(want, buf)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-gcDone
	close(errs)
	for err := range errs {
		return err
	}
	st := m.Stats()
	if err := m.Close(); err != nil {
		return err
	}
	if gcs.Load() == 0 || st.Faults == 0 {
		return fmt.Errorf("%d collections, %d faults: the scenario did not run", gcs.Load(), st.Faults)
	}
	fmt.Printf("%d faults, %d evictions, %d collections\n", st.Faults, st.Evictions, gcs.Load())
	return nil
}
