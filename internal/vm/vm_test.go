package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd/nbdtest"
	"github.com/rialto-project/rialto/internal/dataplane/block/stripe"
	"github.com/rialto-project/rialto/internal/vm/vmtest"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files under testdata/")

// TestArgsGolden pins qemu's command line for the accelerators: no disk
// and no export name on it (the disk comes over QMP).
func TestArgsGolden(t *testing.T) {
	var b bytes.Buffer
	for _, c := range []Config{
		{Name: "vm1", Dir: "/run/rialto/vm/vm1", Kernel: "/boot/vmlinuz", Initrd: "/boot/initrd.img", Append: "console=ttyS0 quiet",
			Accel: AccelTCG, Disk: nbd.URI{Network: "unix", Address: "/run/rialto/vm/vm1/disk.sock", Export: "rlc_secret"}},
		{Name: "big", Dir: "/s,odd/big", Kernel: "/k", MemoryMiB: 4096, CPUs: 4, Accel: AccelKVM,
			Disk: nbd.URI{Network: "unix", Address: "/s,odd/big/disk.sock", Export: "rlc_secret"}},
	} {
		if c.MemoryMiB == 0 {
			c.MemoryMiB = 256
		}
		if c.CPUs == 0 {
			c.CPUs = 1
		}
		fmt.Fprintf(&b, "== %s\n%s\n", c.Name, strings.Join(c.Args(), "\n"))
		if strings.Contains(strings.Join(c.Args(), " "), "rlc_secret") {
			t.Errorf("%s: the export name is on qemu's command line", c.Name)
		}
		fmt.Fprintf(&b, "-- blockdev-add %v\n", c.blockdev())
	}
	path := filepath.Join("testdata", "args.golden")
	if *rewrite {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run ArgsGolden -rewrite)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("qemu's arguments changed (go test -run ArgsGolden -rewrite to accept):\n%s", b.String())
	}
}

func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "kernel")
	os.WriteFile(k, []byte("k"), 0o600)
	disk := nbd.URI{Network: "unix", Address: filepath.Join(dir, "disk.sock"), Export: "x"}
	ok := Config{Name: "a", Dir: dir, Kernel: k, Accel: AccelTCG, Disk: disk}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"fine", func(*Config) {}, ""},
		{"bad name", func(c *Config) { c.Name = "../x" }, "name"},
		{"hidden name", func(c *Config) { c.Name = ".x" }, "name"},
		{"no kernel", func(c *Config) { c.Kernel = "" }, "no kernel"},
		{"missing kernel", func(c *Config) { c.Kernel = filepath.Join(dir, "nope") }, "not a readable file"},
		{"kernel is a directory", func(c *Config) { c.Kernel = dir }, "not a readable file"},
		{"missing initrd", func(c *Config) { c.Initrd = filepath.Join(dir, "nope") }, "not a readable file"},
		{"tiny memory", func(c *Config) { c.MemoryMiB = 8 }, "memory 8 MiB"},
		{"no accel", func(c *Config) { c.Accel = "" }, "accelerator"},
		{"auto unresolved", func(c *Config) { c.Accel = AccelAuto }, "accelerator"},
		{"no disk", func(c *Config) { c.Disk = nbd.URI{} }, "no disk"},
		{"a lender's disk", func(c *Config) { c.Disk = nbd.URI{Network: "tcp", Address: "127.0.0.1:1", Export: "x"} }, "want a local attachment's Unix socket"},
		{"a lender's disk over TLS", func(c *Config) {
			c.Disk = nbd.URI{Network: "tcp", Address: "127.0.0.1:1", Export: "x", TLS: true}
		}, "want a local attachment's Unix socket"},
		{"newline in append", func(c *Config) { c.Append = "a\nb" }, "newline"},
		{"long dir", func(c *Config) { c.Dir = "/" + strings.Repeat("d", 120) }, "too long for a Unix socket"},
	} {
		c := ok
		tc.edit(&c)
		err := c.check()
		if tc.want == "" {
			if err != nil || c.MemoryMiB != 256 || c.CPUs != 1 {
				t.Errorf("%s: %v (%d MiB, %d CPUs)", tc.name, err, c.MemoryMiB, c.CPUs)
			}
			continue
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// The KVM probe gives a verdict within its timeout (here KVM may hang),
// and ResolveAccel caches it: the second call does not probe again.
func TestResolveAccel(t *testing.T) {
	t.Parallel()
	qemu := needQEMU(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, want := range []string{AccelTCG, AccelKVM} {
		if got, _, err := ResolveAccel(ctx, want, qemu, dir); got != want || err != nil {
			t.Errorf("ResolveAccel(%s) = %s, %v", want, got, err)
		}
	}
	if _, _, err := ResolveAccel(ctx, "xen", qemu, dir); !errors.Is(err, ErrConfig) {
		t.Errorf("ResolveAccel(xen): %v", err)
	}
	t0 := time.Now()
	first, why, err := ResolveAccel(ctx, AccelAuto, qemu, dir)
	if err != nil || (first != AccelKVM && first != AccelTCG) || (first == AccelTCG && why == "") {
		t.Fatalf("auto: %s (%q), %v", first, why, err)
	}
	if d := time.Since(t0); d > ProbeTimeout+20*time.Second {
		t.Errorf("the probe took %v", d)
	}
	t.Logf("auto chose %s: %s", first, why)
	// The cached verdict is used: doctor it and ask again.
	path := filepath.Join(dir, "kvm-probe.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec probeRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	rec.KVM, rec.Reason = false, "from the cache"
	b, _ = json.Marshal(rec)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, why, err := ResolveAccel(ctx, AccelAuto, qemu, dir); err != nil || got != AccelTCG || why != "from the cache" {
		t.Errorf("cached: %s (%q), %v", got, why, err)
	}
}

// A guest boots under TCG from a disk striped over two lenders and served
// on a Unix socket (what `rialto vm run` does for every lease), writes
// its marker, and is stopped cleanly: the marker is on the lenders, where
// the stripe layout puts it, by the time Run returns. qemu's command line
// never shows the export names.
func TestBootComposedDisk(t *testing.T) {
	t.Parallel()
	qemu := needQEMU(t)
	g := vmtest.Find(t)
	const unit = 64 << 10
	var uris []string
	var parts []*nbd.MemBackend
	for i, name := range []string{"rlc_vm_part0", "rlc_vm_part1"} {
		be := nbd.NewMemBackend(8 << 20)
		parts = append(parts, be)
		uris = append(uris, nbdtest.Lender(t, name, be))
		_ = i
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	att, err := stripe.Attach(ctx, stripe.AttachConfig{URIs: uris, StripeUnit: unit, Listen: "unix:" + filepath.Join(dir, "disk.sock"), ExportName: "rlc_local_export"})
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	disk, err := nbd.ParseURI(att.URI())
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Name: "guest1", Dir: filepath.Join(dir, "guest1"), Kernel: g.Kernel, Initrd: g.Initrd, Append: vmtest.Append("composed-1"),
		Accel: AccelTCG, Disk: disk, QEMU: qemu}
	runCtx, stop := context.WithCancel(ctx)
	readyc := make(chan Running, 1)
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, c, nil, func(r Running) { readyc <- r }) }()
	var r Running
	select {
	case r = <-readyc:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.PID))
	if err != nil || bytes.Contains(cmdline, []byte("rlc_")) || !bytes.Contains(cmdline, []byte("accel=tcg")) {
		t.Errorf("qemu's command line (%v): %q", err, cmdline)
	}
	line := vmtest.WaitConsole(t, filepath.Join(c.Dir, ConsoleLog), 0, vmtest.Wrote, 3*time.Minute)
	if line != vmtest.Wrote+" composed-1" {
		t.Fatalf("console: %q", line)
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stop: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after the stop")
	}
	// The marker's volume offset, through the layout, onto the parts.
	u := vmtest.MarkerOffset / unit
	got := make([]byte, 32)
	if _, err := parts[u%2].ReadAt(got, int64(u/2*unit+vmtest.MarkerOffset%unit)); err != nil {
		t.Fatal(err)
	}
	if want := "RIALTO-MARKER:composed-1"; !bytes.HasPrefix(got, []byte(want)) {
		t.Fatalf("the lender holds %q at the marker's place, want %q", got, want)
	}
	if Alive(r.PID) {
		t.Errorf("qemu %d still runs", r.PID)
	}
}
