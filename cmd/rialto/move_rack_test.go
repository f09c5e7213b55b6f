package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/rack"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestMoveAndDrainOnRack is the demonstration on the emulated
// rack (rialto server and four rialto agent processes in network
// namespaces, links shaped with tc tbf): fio with --verify=crc32c writes
// a composed block lease through `rialto attach` on node4 while one part
// is moved (`rialto lease move`) and then while the other part's node is
// drained (`rialto node drain`): fio sees no I/O error and no verify
// failure; the copied bytes leave the old lender and enter the new one
// and do not cross the borrower's link; the drain moves the part, leaves
// an accelerator lease whose Wasm role keeps state in its slot, reports it
// and exits non-zero; a memory lease's mapping, open across the lease's
// move, reads what it wrote before it.
func TestMoveAndDrainOnRack(t *testing.T) {
	needNetns(t)
	bin := buildBinary(t)
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio not installed")
	}
	if out, err := exec.Command("fio", "--enghelp=nbd").CombinedOutput(); err != nil {
		t.Skipf("fio has no nbd engine: %s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := rack.Start(ctx, rack.Config{Binary: bin, StateDir: filepath.Join(t.TempDir(), "rack"), Agents: 4,
		Disks: 1, DiskSize: 96 << 20, Memory: 16 << 20, AccelSlots: 1, LinkRate: "200mbit", LogLevel: "warn"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	n1, n2, n3, n4 := r.Agent(0), r.Agent(1), r.Agent(2), r.Agent(3) // node3 takes part 0, node4 borrows
	cl := r.Client()
	const part = 24 << 20
	l, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 2, Size: 2 * part,
		Affinity: []string{n1.Name, n2.Name}})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Parts) != 2 || l.Parts[0].NodeID == l.Parts[1].NodeID {
		t.Fatalf("lease parts %+v", l.Parts)
	}
	nodeOf := map[string]rack.Node{}
	ns, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range r.Agents() {
		for _, x := range ns {
			if x.Name == n.Name {
				nodeOf[x.ID] = n
			}
		}
	}
	from0, from1 := nodeOf[l.Parts[0].NodeID], nodeOf[l.Parts[1].NodeID]
	wasm, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindAccel, Role: "wasm", RoleConfig: &api.RoleConfig{Module: wasmtest.EchoModule()},
		Affinity: []string{from1.Name}})
	if err != nil {
		t.Fatal(err)
	}

	// The rack's data planes serve TLS (nbds://, rialto-mems://): Go
	// clients trust its CA.
	dataTLS, err := r.DataTLS()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(l.Parts[0].URI, "nbds://") {
		t.Fatalf("part URI %q is not nbds://", l.Parts[0].URI)
	}

	// Both parts full of random bytes: the move has data to copy (holes
	// are sent as zeroing requests, not bytes).
	noise := make([]byte, part)
	for _, p := range l.Parts {
		rand.Read(noise)
		nc, err := nbd.DialURI(ctx, p.URI, nbd.WithTLS(dataTLS))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.WriteAtContext(ctx, noise, 0, true); err != nil {
			t.Fatal(err)
		}
		nc.Close()
	}

	// rialto attach on the borrower, node4.
	env := append(os.Environ(), r.Env()...)
	env = append(env, "XDG_RUNTIME_DIR="+t.TempDir())
	att := r.Command(ctx, n4, bin, "attach", l.ID)
	att.Env = env
	stdout, err := att.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var attErr bytes.Buffer
	att.Stderr = &attErr
	if err := att.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { att.Process.Kill(); att.Wait() }()
	uri, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("attach: %v: %s", err, attErr.String())
	}
	uri = strings.TrimSpace(uri)
	go io.Copy(io.Discard, stdout)

	// fio, rate-limited so that it writes (and verifies what it wrote)
	// through the move and the drain, then verifies everything.
	fio := r.Command(ctx, n4, "fio", "--name=move", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bsrange=4k-64k",
		"--size=40m", "--iodepth=8", "--rate=2m", "--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--verify_backlog=512", "--verify_state_save=0",
		"--randrepeat=0")
	fio.Dir = t.TempDir() // its verify state file (local-move-0-verify.state) goes there
	var fioOut bytes.Buffer
	fio.Stdout, fio.Stderr = &fioOut, &fioOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()
	defer func() {
		if fio.ProcessState == nil {
			fio.Process.Kill()
			<-fioDone
		}
	}()
	counters := func() map[string]netns.Counters {
		m := map[string]netns.Counters{}
		for _, n := range r.Agents() {
			c, err := r.Counters(n)
			if err != nil {
				t.Fatal(err)
			}
			m[n.Name] = c
		}
		return m
	}
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), r.Env()...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// Some writes first.
	start := counters()
	testcluster.Eventually(t, time.Minute, "fio's first writes", func() bool {
		return counters()[n4.Name].FromHost-start[n4.Name].FromHost > 2<<20
	})

	// 1. Move part 0 to node3 while fio runs.
	before := counters()
	out, err := cli("lease", "move", l.ID, "--part", "0", "--to", n3.Name)
	if err != nil {
		t.Fatalf("lease move: %v\n%s", err, out)
	}
	after := counters()
	const mib = 1 << 20
	srcOut := after[from0.Name].FromHost - before[from0.Name].FromHost
	dstIn := after[n3.Name].ToHost - before[n3.Name].ToHost
	bIn := after[n4.Name].ToHost - before[n4.Name].ToHost
	bOut := after[n4.Name].FromHost - before[n4.Name].FromHost
	t.Logf("move of part 0: %s sent %.1f MiB, %s received %.1f MiB; the borrower's link carried %.1f MiB in, %.1f MiB out",
		from0.Name, float64(srcOut)/mib, n3.Name, float64(dstIn)/mib, float64(bIn)/mib, float64(bOut)/mib)
	ms, err := cl.Moves(ctx, l.ID)
	if err != nil || len(ms) != 1 || ms[0].State != api.MoveDone {
		t.Fatalf("moves %+v %v\n%s", ms, err, out)
	}
	copied := ms[0].Copied
	if copied < part/2 {
		t.Errorf("the move copied %d B of a %d B part full of data", copied, part)
	}
	if srcOut < copied || dstIn < copied {
		t.Errorf("the %d bytes copied did not go from %s (%d B out) to %s (%d B in)", copied, from0.Name, srcOut, n3.Name, dstIn)
	}
	if bIn+bOut >= copied {
		t.Errorf("the borrower's link carried %d B during a move that copied %d B", bIn+bOut, copied)
	}

	// 2. Drain part 1's node while fio runs: the part moves, the Wasm
	// lease stays and is reported; the command exits non-zero.
	out, err = cli("node", "drain", from1.Name, "--deadline", "3m")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, wasm.ID) || !strings.Contains(out, "wasm keeps state") ||
		!strings.Contains(out, "incomplete") {
		t.Fatalf("node drain: %v\n%s", err, out)
	}
	t.Logf("rialto node drain:\n%s", out)
	got, err := cl.Lease(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range got.Parts {
		if p.NodeID == l.Parts[i].NodeID {
			t.Errorf("part %d did not move", i)
		}
	}
	if w, _ := cl.Lease(ctx, wasm.ID); w.NodeID != wasm.NodeID || w.State != api.LeaseActive {
		t.Errorf("the wasm lease: %+v", w)
	}
	evs := allEvents(ctx, t, cl)
	told := false
	for _, e := range evs {
		told = told || (e.Subject == wasm.ID && e.Type == "lease.drain.left")
	}
	if !told {
		t.Error("the wasm lease's tenant was not told it stays")
	}

	// fio ends its writes and verifies everything: no error.
	select {
	case err := <-fioDone:
		if err != nil {
			t.Fatalf("fio: %v\n%s", err, fioOut.String())
		}
	case <-ctx.Done():
		t.Fatalf("fio did not finish: %s", fioOut.String())
	}
	if s := fioOut.String(); !strings.Contains(s, "err= 0") || strings.Contains(s, "verify: bad") || strings.Contains(s, "error") {
		t.Fatalf("fio:\n%s", s)
	}
	if testing.Verbose() {
		t.Logf("fio:\n%s", fioOut.String())
	}

	// 3. A memory lease's mapping stays open across the lease's move, over
	// TLS (the rack's data planes serve it): written before the move (some
	// pages still dirty in its cache at the switch), read after it at the
	// new place through the same mapping, whose fault handler took a TLS
	// connection to the new donor. The mapping is touched with plain loops
	// (not copy): see docs/memory-protocol.md, "A region that moved".
	mem, err := cl.CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 4 << 20, Affinity: []string{from0.Name}})
	if err != nil {
		t.Fatal(err)
	}
	mm, err := borrower.MapMemory(ctx, cl, mem, 0, client.Options{Timeout: 10 * time.Second, TLS: dataTLS}, mapping.Options{})
	if errors.Is(err, mapping.ErrUffdUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer mm.Close()
	if !strings.HasPrefix(mem.URI, "rialto-mems://") {
		t.Fatalf("the memory lease's URI is not a TLS one: %s", mem.URI)
	}
	b := mm.Bytes()
	want := make([]byte, len(b))
	for i := range want {
		want[i] = byte(i*7 + i/4096)
	}
	for i := range b {
		b[i] = want[i]
	}
	if _, err := cl.MoveLease(ctx, mem.ID, api.MoveRequest{ToNode: n3.Name}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 60*time.Second, "the memory lease's move", func() bool {
		ms, err := cl.Moves(ctx, mem.ID)
		return err == nil && len(ms) > 0 && ms[len(ms)-1].State == api.MoveDone
	})
	moved, err := cl.Lease(ctx, mem.ID)
	if err != nil || moved.NodeID == mem.NodeID || !strings.HasPrefix(moved.URI, "rialto-mems://") {
		t.Fatalf("the memory lease after its move: %+v %v", moved, err)
	}
	for i := range b {
		if b[i] != want[i] {
			t.Fatalf("the moved lease's mapping reads byte %d as %d, want %d (%v)", i, b[i], want[i], mm.Err())
		}
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] ^= 0xff
		want[i] ^= 0xff
	}
	if err := mm.Flush(); err != nil {
		t.Fatalf("flush at the new place: %v", err)
	}
	if st := mm.Stats(); st.Follows == 0 || mm.Session.Moves() != 1 || mm.Err() != nil {
		t.Fatalf("the mapping across the move: %d new connection(s), session moves %d, err %v", st.Follows, mm.Session.Moves(), mm.Err())
	}
	if err := mm.Close(); err != nil {
		t.Fatal(err)
	}
	// The new place holds what the mapping wrote there.
	mc, err := borrower.DialMemory(ctx, moved, 0, client.Options{Timeout: 10 * time.Second, TLS: dataTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	memGot := make([]byte, len(want))
	if err := mc.Read(ctx, client.ChannelBulk, memGot, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(memGot, want) {
		t.Fatal("the new place does not hold the bytes written through the mapping")
	}
}

// allEvents reads the whole event log, page after page.
func allEvents(ctx context.Context, t *testing.T, cl *api.Client) []api.Event {
	t.Helper()
	var all []api.Event
	var since int64
	for {
		evs, err := cl.Events(ctx, since)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return all
		}
		all = append(all, evs...)
		since = evs[len(evs)-1].ID
	}
}
