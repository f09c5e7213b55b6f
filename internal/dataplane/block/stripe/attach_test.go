package stripe

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd/nbdkittest"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// lender is an in-process NBD server with one export on loopback.
type lender struct {
	mem    *nbd.MemBackend // nil unless started by startLender
	be     nbd.Backend
	srv    *nbd.Server
	name   string
	uri    string
	ln     net.Listener
	cancel context.CancelFunc
	done   chan struct{}
	// maxBlock is the largest request the export takes (0: the default),
	// kept across restarts.
	maxBlock uint32
}

func startLender(t *testing.T, size int64) *lender {
	t.Helper()
	mem := nbd.NewMemBackend(size)
	l := startLenderWith(t, mem)
	l.mem = mem
	return l
}

// startLenderWith serves be as the lender's one export.
func startLenderWith(t *testing.T, be nbd.Backend) *lender {
	t.Helper()
	return startLenderMaxBlock(t, be, 0)
}

// startLenderMaxBlock serves be as the lender's one export, taking requests
// of at most maxBlock bytes (0: the default).
func startLenderMaxBlock(t *testing.T, be nbd.Backend, maxBlock uint32) *lender {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	rand.Read(b[:])
	name := "cred-" + hex.EncodeToString(b[:])
	l := &lender{be: be, name: name, maxBlock: maxBlock}
	l.serve(t, ln)
	l.uri = nbd.URI{Network: "tcp", Address: ln.Addr().String(), Export: name}.String()
	t.Cleanup(func() { l.kill() })
	return l
}

func (l *lender) serve(t *testing.T, ln net.Listener) {
	t.Helper()
	srv := &nbd.Server{}
	if err := srv.AddExport(nbd.Export{Name: l.name, Backend: l.be, MaxBlock: l.maxBlock}); err != nil {
		t.Error(err) // not Fatal: restart may run outside the test goroutine
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	l.ln, l.cancel, l.done, l.srv = ln, cancel, done, srv
	go func() {
		defer close(done)
		srv.Serve(ctx, ln)
	}()
}

// restart serves the same export with the same data on the same address
// again, as when a killed lender process comes back.
func (l *lender) restart(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", l.ln.Addr().String())
	if err != nil {
		t.Error(err) // not Fatal: restart may run outside the test goroutine
		return
	}
	l.serve(t, ln)
}

// kill stops the server and drops every connection, as when the lender
// process dies.
func (l *lender) kill() { l.cancel(); <-l.done }

func attach(t *testing.T, cfg AttachConfig) *Attachment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := Attach(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

// TestAttachNbdcopy round-trips 256 MiB of random data through a 3-way
// composed volume over three real NBD servers with nbdcopy, and compares
// checksums.
func TestAttachNbdcopy(t *testing.T) {
	need(t, "nbdcopy")
	const part = 86 << 20 // 3 × 86 MiB ≥ 256 MiB
	var uris []string
	for range 3 {
		uris = append(uris, startLender(t, part).uri)
	}
	a := attach(t, AttachConfig{URIs: uris, StripeUnit: 128 << 10})
	if got := a.Volume().Size(); got != 3*part {
		t.Fatalf("volume size %d, want %d", got, 3*part)
	}
	const size = 256 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	// Write: random data on nbdcopy's stdin.
	data := make([]byte, size)
	mrand.NewChaCha8([32]byte{3}).Read(data)
	wh := sha256.New()
	wh.Write(data)
	wh.Write(make([]byte, 3*part-size)) // the volume's tail stays zero
	want := wh.Sum(nil)
	in := exec.CommandContext(ctx, "nbdcopy", "--flush", "-", a.URI())
	in.Stdin = bytes.NewReader(data)
	start := time.Now()
	if out, err := in.CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy write: %v: %s", err, out)
	}
	t.Logf("nbdcopy wrote 256 MiB in %v", time.Since(start))
	start = time.Now()
	// Read: the whole volume on stdout.
	h := sha256.New()
	outc := exec.CommandContext(ctx, "nbdcopy", a.URI(), "-")
	outc.Stdout = h
	var stderr bytes.Buffer
	outc.Stderr = &stderr
	if err := outc.Run(); err != nil {
		t.Fatalf("nbdcopy read: %v: %s", err, stderr.String())
	}
	t.Logf("nbdcopy read %d MiB in %v", 3*part>>20, time.Since(start))
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		t.Fatalf("checksum after round trip %x, want %x", got, want)
	}
}

// TestAttachQemu checks the composed volume with qemu-img compare (against a
// file holding the same bytes) and qemu-io patterns at odd offsets, over a
// Unix socket.
func TestAttachQemu(t *testing.T) {
	need(t, "qemu-img", "qemu-io")
	const part = 4 << 20
	var uris []string
	for range 3 {
		uris = append(uris, startLender(t, part).uri)
	}
	dir := t.TempDir()
	a := attach(t, AttachConfig{URIs: uris, StripeUnit: 64 << 10, Listen: "unix:" + filepath.Join(dir, "vol.sock")})
	if !strings.HasPrefix(a.URI(), "nbd+unix:///") {
		t.Fatalf("URI %q", a.URI())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	data := make([]byte, 3*part)
	mrand.NewChaCha8([32]byte{9}).Read(data)
	img := filepath.Join(dir, "ref.raw")
	if err := os.WriteFile(img, data, 0o600); err != nil {
		t.Fatal(err)
	}
	u, _ := nbd.ParseURI(a.URI())
	c, err := nbd.Dial(ctx, u.Network, u.Address, u.Export)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	c.Close()

	run := func(name string, args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		return string(out), err
	}
	if out, err := run("qemu-img", "compare", "-f", "raw", "-F", "raw", img, a.URI()); err != nil {
		t.Fatalf("qemu-img compare: %v: %s", err, out)
	}
	// A pattern across units and parts at odd offsets, read back by qemu-io.
	out, err := run("qemu-io", "-f", "raw",
		"-c", "write -P 0xa5 65533 200007",
		"-c", "read -P 0xa5 65533 200007",
		"-c", "write -z 1000000 300000",
		"-c", "read -P 0 1000000 300000",
		"-c", "flush",
		a.URI())
	if err != nil || strings.Contains(out, "Pattern verification failed") || strings.Contains(out, "failed") {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	// The same changes to the reference file; compare again.
	copy(data[65533:], bytes.Repeat([]byte{0xa5}, 200007))
	clear(data[1000000:1300000])
	if err := os.WriteFile(img, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run("qemu-img", "compare", "-f", "raw", "-F", "raw", img, a.URI()); err != nil {
		t.Fatalf("qemu-img compare after qemu-io: %v: %s", err, out)
	}
	// And a difference is detected.
	data[3*part-1] ^= 1
	if err := os.WriteFile(img, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run("qemu-img", "compare", "-f", "raw", "-F", "raw", img, a.URI()); err == nil {
		t.Fatalf("qemu-img compare missed a difference: %s", out)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "vol.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after Close: %v", err)
	}
}

// blackhole forwards TCP to target until frozen; then it forwards nothing
// and closes nothing, like a lender whose host vanished from the network.
type blackhole struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	frozen bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newBlackhole(t *testing.T, target string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	b.wg.Go(b.accept)
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *blackhole) accept() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", b.target)
		if err != nil {
			c.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, c, s)
		b.mu.Unlock()
		b.wg.Go(func() { b.pipe(s, c) })
		b.wg.Go(func() { b.pipe(c, s) })
	}
}

func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		b.mu.Lock()
		frozen := b.frozen
		b.mu.Unlock()
		if frozen {
			if err != nil {
				return // the peer went away; a vanished host closes nothing
			}
			continue // swallow
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (b *blackhole) freeze() { b.mu.Lock(); b.frozen = true; b.mu.Unlock() }

// TestLenderFailure: while a client streams reads and writes through the
// attachment, one lender dies (connections dropped) or vanishes (nothing
// answers); the client sees an I/O error within the bound, never a hang.
func TestLenderFailure(t *testing.T) {
	const timeout = 3 * time.Second // generous: the race detector on a loaded 2-vCPU machine
	for _, mode := range []string{"killed", "vanished"} {
		t.Run(mode, func(t *testing.T) {
			const part = 8 << 20
			l0, l1, l2 := startLender(t, part), startLender(t, part), startLender(t, part)
			uri1 := l1.uri
			var bh *blackhole
			if mode == "vanished" {
				bh = newBlackhole(t, l1.ln.Addr().String())
				u, _ := nbd.ParseURI(l1.uri)
				u.Address = bh.ln.Addr().String()
				uri1 = u.String()
			}
			a := attach(t, AttachConfig{URIs: []string{l0.uri, uri1, l2.uri}, StripeUnit: 64 << 10, RequestTimeout: timeout})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			u, _ := nbd.ParseURI(a.URI())
			c, err := nbd.Dial(ctx, u.Network, u.Address, u.Export, nbd.WithRequestTimeout(20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()

			failed := make(chan time.Time, 4)
			started := make(chan struct{}, 4)
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					buf := make([]byte, 256<<10)
					for i := 0; ctx.Err() == nil; i++ {
						off := int64((i*4+w)%(3*part/len(buf))) * int64(len(buf))
						var err error
						if w%2 == 0 {
							_, err = c.ReadAt(buf, off)
						} else {
							_, err = c.WriteAt(buf, off)
						}
						if i == 1 {
							started <- struct{}{}
						}
						if err != nil {
							failed <- time.Now()
							return
						}
					}
				})
			}
			for range 4 {
				<-started
			}
			killed := time.Now()
			if mode == "killed" {
				l1.kill()
			} else {
				bh.freeze()
			}
			for range 4 {
				select {
				case at := <-failed:
					if d := at.Sub(killed); d > 3*timeout {
						t.Errorf("error %v after the lender failed, bound %v", d, timeout)
					}
				case <-time.After(10 * timeout):
					t.Fatal("a request hung after the lender failed")
				}
			}
			cancel()
			wg.Wait()
			if f := a.Volume().Failed(); mode == "vanished" && (len(f) != 1 || f[0] != 1) {
				t.Errorf("Failed() = %v, want [1]", f)
			}
			// Requests that avoid the lost part still work; ones that
			// touch it fail at once.
			c2, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			if _, err := c2.ReadAt(make([]byte, 4096), 0); err != nil {
				t.Errorf("read of part 0: %v", err)
			}
			start := time.Now()
			_, err = c2.ReadAt(make([]byte, 4096), 64<<10)
			var ne *nbd.Error
			if !errors.As(err, &ne) || ne.Errno != nbd.EIO {
				t.Errorf("read of the lost part: %v, want EIO", err)
			}
			if d := time.Since(start); d > 2*timeout {
				t.Errorf("read of the lost part took %v", d)
			}
		})
	}
}

// TestAttachNbdkitKilled composes over nbdkit lenders and SIGKILLs one.
func TestAttachNbdkitKilled(t *testing.T) {
	need(t, "nbdkit")
	dir := t.TempDir()
	var uris []string
	var procs []*exec.Cmd
	for i := range 2 {
		sock := filepath.Join(dir, fmt.Sprintf("l%d.sock", i))
		cmd := nbdkittest.Start(t, sock, "memory", "16M")
		procs = append(procs, cmd)
		uris = append(uris, nbd.URI{Network: "unix", Address: sock}.String())
	}
	const timeout = 3 * time.Second // generous: the race detector on a loaded 2-vCPU machine
	a := attach(t, AttachConfig{URIs: uris, StripeUnit: 64 << 10, RequestTimeout: timeout})
	u, _ := nbd.ParseURI(a.URI())
	c, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := make([]byte, 1<<20)
	mrand.NewChaCha8([32]byte{1}).Read(data)
	if _, err := c.WriteAt(data, 12345); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := c.ReadAt(got, 12345); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back over nbdkit: %v", err)
	}
	procs[1].Process.Kill()
	start := time.Now()
	_, err = c.ReadAt(got, 0)
	if err == nil {
		t.Fatal("read over a killed lender succeeded")
	}
	if d := time.Since(start); d > 3*timeout {
		t.Errorf("error after %v", d)
	}
}

// TestCloseWithHungPart: detaching while a request waits on a lender that
// stopped answering returns at once, not after RequestTimeout.
func TestCloseWithHungPart(t *testing.T) {
	h := newHang(1 << 20)
	v, err := New([]Device{newMem(1 << 20), h}, Config{StripeUnit: 64 << 10, RequestTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, err := Serve(context.Background(), v, ServeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := nbd.ParseURI(a.URI())
	c, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := c.ReadAt(make([]byte, 4096), 64<<10) // on the hung part
		errc <- err
	}()
	<-h.entered
	start := time.Now()
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v with a hung part", d)
	}
	if err := <-errc; err == nil {
		t.Error("read on the hung part succeeded")
	}
}

func TestAttachBadConfig(t *testing.T) {
	secret := "s3cret-credential"
	for _, uris := range [][]string{nil, {"nbd://127.0.0.1:1/" + secret + "%zz"}, {"http://x/" + secret}} {
		_, err := Attach(context.Background(), AttachConfig{URIs: uris})
		if !errors.Is(err, ErrConfig) {
			t.Errorf("Attach(%d URIs) = %v, want ErrConfig", len(uris), err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error quotes the credential: %v", err)
		}
	}
	// A part nobody serves: a dial error, naming the address only.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Attach(ctx, AttachConfig{URIs: []string{"nbd://" + addr + "/" + secret}})
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("Attach to a closed port = %v", err)
	}
}

// TestAttachFio runs fio's NBD engine with verification against a 3-way
// volume: random writes of mixed sizes, then a verifying read pass.
func TestAttachFio(t *testing.T) {
	need(t, "fio")
	if out, err := exec.Command("fio", "--enghelp=nbd").CombinedOutput(); err != nil {
		t.Skipf("fio has no nbd engine: %s", out)
	}
	for _, wb := range []bool{false, true} {
		t.Run(fmt.Sprintf("write-back=%v", wb), func(t *testing.T) {
			var uris []string
			for range 3 {
				uris = append(uris, startLender(t, 8<<20).uri)
			}
			a := attach(t, AttachConfig{URIs: uris, StripeUnit: 64 << 10, WriteBack: wb})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, "fio", "--name=verify", "--ioengine=nbd", "--uri="+a.URI(),
				"--rw=randwrite", "--bsrange=4k-192k", "--size=24m", "--iodepth=16",
				"--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--randrepeat=0", "--verify_state_save=0").CombinedOutput()
			if err != nil {
				t.Fatalf("fio: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "err= 0") || strings.Contains(string(out), "verify: bad") {
				t.Fatalf("fio output:\n%s", out)
			}
			if testing.Verbose() {
				t.Logf("fio:\n%s", out)
			}
			if wb && a.wb.early.Load() == 0 {
				t.Error("no write was acknowledged early")
			}
		})
	}
}

// TestLenderRestart kills a lender and brings it back (same address, same
// export, same data) while the volume is attached: requests that find the
// connections broken redial and succeed, the volume keeps no failed part,
// and a flush reports writes that no flush had covered when the lender died.
func TestLenderRestart(t *testing.T) {
	const part = 8 << 20
	l0, l1, l2 := startLender(t, part), startLender(t, part), startLender(t, part)
	a := attach(t, AttachConfig{URIs: []string{l0.uri, l1.uri, l2.uri}, StripeUnit: 64 << 10, RequestTimeout: 10 * time.Second})
	u, _ := nbd.ParseURI(a.URI())
	c, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := make([]byte, 1<<20)
	mrand.NewChaCha8([32]byte{2}).Read(data)
	if _, err := c.WriteAt(data, 4096); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	// Down for a while: the read that finds the part gone waits for it.
	l1.kill()
	back := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { l1.restart(t); close(back) })
	got := make([]byte, len(data))
	if _, err := c.ReadAt(got, 4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read across the lender restart: %v", err)
	}
	<-back
	if f := a.Volume().Failed(); len(f) != 0 {
		t.Fatalf("Failed() = %v after a restart", f)
	}

	// Unflushed writes when the lender dies: the next flush says so, once.
	if _, err := c.WriteAt(data, 2<<20); err != nil {
		t.Fatal(err)
	}
	l1.kill()
	l1.restart(t)
	if _, err := c.ReadAt(got, 2<<20); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after the second restart: %v", err)
	}
	var ne *nbd.Error
	if err := c.Flush(); !errors.As(err, &ne) || ne.Errno != nbd.EIO {
		t.Fatalf("flush after losing unflushed writes: %v, want EIO", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("second flush: %v", err)
	}
	if _, err := c.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestPartMoved moves a part while the volume is attached, the way a
// lender moves a lease: writes paused, the bytes copied to another
// lender, the old export retired (its requests answered ESHUTDOWN) once
// Resolve gives the new URI. Requests go on without an error, and the
// writes no flush had covered before the move are not reported lost.
func TestPartMoved(t *testing.T) {
	const part = 8 << 20
	l0, l1, dst := startLender(t, part), startLender(t, part), startLender(t, part)
	var cur atomic.Value
	cur.Store(l0.uri)
	resolve := func(_ context.Context, i int) (string, error) {
		if i == 0 {
			return cur.Load().(string), nil
		}
		return l1.uri, nil
	}
	a := attach(t, AttachConfig{URIs: []string{l0.uri, l1.uri}, StripeUnit: 64 << 10, Resolve: resolve, RequestTimeout: 10 * time.Second})
	u, _ := nbd.ParseURI(a.URI())
	c, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := make([]byte, 2<<20)
	mrand.NewChaCha8([32]byte{3}).Read(data)
	if _, err := c.WriteAt(data, 0); err != nil { // not flushed
		t.Fatal(err)
	}

	ctx := context.Background()
	if err := l0.srv.PauseWrites(ctx, l0.name); err != nil {
		t.Fatal(err)
	}
	// A write issued now is held at the old lender until the switch.
	w := make(chan error, 1)
	go func() {
		_, err := c.WriteAt(data[:1<<20], 4<<20)
		w <- err
	}()
	img := make([]byte, part)
	l0.mem.ReadAt(img, 0)
	dst.mem.WriteAt(img, 0)
	cur.Store(dst.uri)
	if err := l0.srv.Retire(ctx, l0.name); err != nil {
		t.Fatal(err)
	}
	if err := <-w; err != nil {
		t.Fatalf("write across the move: %v", err)
	}
	got := make([]byte, len(data))
	if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after the move: %v", err)
	}
	if _, err := c.ReadAt(got[:1<<20], 4<<20); err != nil || !bytes.Equal(got[:1<<20], data[:1<<20]) {
		t.Fatalf("the write held across the move: %v", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flush after the move: %v", err)
	}
	if f := a.Volume().Failed(); len(f) != 0 {
		t.Fatalf("Failed() = %v after a move", f)
	}
}

// TestAttachManyInFlight drives many requests at once through the
// attachment (two client connections, 32 goroutines, sizes from 1 byte to
// several stripe units, so both single-unit requests and ones split over
// parts), each goroutine rewriting and reading back its own region: every
// reply carries its own bytes, and the parts, read directly with the same
// layout, hold the last writes.
func TestAttachManyInFlight(t *testing.T) {
	const (
		part    = 4 << 20
		unit    = 64 << 10
		workers = 32
		rounds  = 6
	)
	ls := []*lender{startLender(t, part), startLender(t, part), startLender(t, part)}
	uris := []string{ls[0].uri, ls[1].uri, ls[2].uri}
	a := attach(t, AttachConfig{URIs: uris, StripeUnit: unit, ConnsPerPart: 2})
	u, _ := nbd.ParseURI(a.URI())
	var clients [2]*nbd.Client
	for i := range clients {
		c, err := nbd.Dial(context.Background(), u.Network, u.Address, u.Export)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	size := a.Volume().Size()
	region := size / workers
	reads, writes := startedReads.Load(), startedWrites.Load()
	want := make([]byte, size)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := clients[w%2]
			rng := mrand.New(mrand.NewPCG(uint64(w), 11))
			base := int64(w) * region
			for round := range rounds {
				n := int64(1 + rng.IntN(4*unit))
				if round%2 == 0 {
					n = int64(1 + rng.IntN(8<<10)) // small: mostly within one unit
				}
				n = min(n, region)
				off := base + rng.Int64N(region-n+1)
				p := want[off : off+n]
				for i := range p {
					p[i] = byte(w*37 + round*5 + i)
				}
				if _, err := c.WriteAt(p, off); err != nil {
					errs <- fmt.Errorf("worker %d write: %w", w, err)
					return
				}
				got := make([]byte, region)
				if _, err := c.ReadAt(got, base); err != nil {
					errs <- fmt.Errorf("worker %d read: %w", w, err)
					return
				}
				if !bytes.Equal(got, want[base:base+region]) {
					errs <- fmt.Errorf("worker %d round %d: read back other bytes than written", w, round)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Reads and writes at depth were sent from the export's reader and
	// answered from the parts' readers (nbd.ReadStarter, nbd.WriteStarter),
	// not by workers.
	if startedReads.Load() == reads || startedWrites.Load() == writes {
		t.Errorf("started on the parts: %d reads, %d writes; want some of each",
			startedReads.Load()-reads, startedWrites.Load()-writes)
	}
	if err := clients[0].Flush(); err != nil {
		t.Fatal(err)
	}
	v, err := Open(context.Background(), OpenConfig{URIs: uris, StripeUnit: unit})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	got := make([]byte, size)
	if _, err := v.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the parts hold other bytes than the last writes")
	}
}
