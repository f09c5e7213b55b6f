package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/logtest"
	"github.com/rialto-project/rialto/internal/testcluster"
	"github.com/rialto-project/rialto/internal/vm"
	"github.com/rialto-project/rialto/internal/vm/vmtest"
)

// TestVMFollowsCARotation: a running `rialto vm run` whose disk is a
// composed block lease (attached in the supervisor, as `rialto attach`
// attaches it, and served to qemu on a Unix socket) keeps its guest's disk
// across a CA rotation and the lender's restart (vmAcrossCARotation).
// Before, the supervisor verified the control plane and the lenders with
// the CA certificates of its start, and its redials failed ("certificate
// signed by unknown authority").
func TestVMFollowsCARotation(t *testing.T) { vmAcrossCARotation(t, 2) }

// TestVMOnePartFollowsCARotation is TestVMFollowsCARotation with a disk
// of one part (a dedicated lease), attached in the supervisor as a
// composed one is. Before, qemu's own NBD client dialled the lender with
// tls-creds-x509 credentials read once at the VM's start: once the
// lender restarted with a certificate of the new CA, the guest's disk
// failed for good.
func TestVMOnePartFollowsCARotation(t *testing.T) { vmAcrossCARotation(t, 1) }

// vmAcrossCARotation boots a guest on a block lease of parts parts (one
// lender) with its own copy of the cluster's ca-cert.pem (--cacert), which
// the rotation leaves as it was, the guest writing its disk and reading it
// back every second past its page cache; then TestAttachFollowsCARotation's
// rotation: `rialto ca rotate`, the control plane's restart (its API
// certificate now from the new CA) and the lender's (its node certificate
// renewed from the new CA: the disk's parts must be redialled). The
// supervisor takes the rotated CA certificates from the control plane at a
// lease check and lists them in the VM's record; the guest writes and
// reads its disk again once the parts are redialled with them; and the
// supervisor still follows its lease through the restarted control plane:
// releasing the lease stops the VM.
func vmAcrossCARotation(t *testing.T, parts int) {
	if testing.Short() {
		t.Skip("boots a guest")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	g := vmtest.Find(t)
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 16 << 20},
		{Name: "disk1", Kind: api.KindBlock, Path: "disk1.img", Size: 16 << 20},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	// A TTL of 8 s: the supervisor checks its lease, and the control
	// plane's CA certificates, every 2 s (a quarter of it).
	req := api.LeaseRequest{Kind: api.KindBlock, Size: 16 << 20, TTLSeconds: 8}
	if parts > 1 {
		req.Mode, req.Count, req.StripeUnit = api.ModeComposed, parts, 64<<10
	}
	l, err := c.Client().CreateLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := borrower.BlockURIs(l); err != nil || len(got) != parts {
		t.Fatalf("the lease has parts %q (%v), want %d", got, err, parts)
	}
	c.Heartbeat() // the lender serves the parts' exports
	caCopy := filepath.Join(t.TempDir(), "vmca-ca-cert.pem")
	if err := os.WriteFile(caCopy, c.CA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "vms")
	var out, errb logtest.Buffer
	runCtx, stop := context.WithCancel(context.Background())
	finished := make(chan struct{})
	code := -1
	go func() {
		defer close(finished)
		code = run(runCtx, []string{"vm", "run", "--disk", l.ID, "--kernel", g.Kernel, "--initrd", g.Initrd,
			"--append", vmtest.AppendWrites("ca-1"), "--accel", "tcg", "--memory", "128MiB", "--name", "guest",
			"--state-dir", state, "--cacert", caCopy, "--log-level", "info"}, clusterEnv(c, t.TempDir(), &out, &errb))
	}()
	t.Cleanup(func() {
		stop()
		select {
		case <-finished:
		case <-time.After(time.Minute):
			t.Error("vm run did not stop")
		}
		if t.Failed() {
			t.Logf("vm run's log:\n%s", errb.String())
		}
	})
	alive := func() {
		t.Helper()
		select {
		case <-finished:
			t.Fatalf("vm run exited %d: %s", code, errb.String())
		default:
		}
	}
	var rec vm.Record
	testcluster.Eventually(t, time.Minute, "the VM to run", func() bool {
		alive()
		rec, err = vm.LoadRecord(state, "guest")
		return err == nil && rec.QEMUPID > 0
	})
	if !slices.Equal(rec.CACertificates, []string{fingerprint(c.CA.Certificate())}) {
		t.Fatalf("the VM's record lists CA certificates %q, want --cacert's", rec.CACertificates)
	}
	if want := "attached here on " + filepath.Join(state, "guest", "disk.sock"); rec.Parts != parts || !strings.Contains(rec.Disk, want) {
		t.Fatalf("the VM's record says its disk is %q of %d parts, want %d parts %s", rec.Disk, rec.Parts, parts, want)
	}
	// rw counts the guest's writes read back whole since byte from of its
	// console.
	rw := func(from int64) int {
		b, err := os.ReadFile(rec.Console)
		if err != nil || int64(len(b)) < from {
			return 0
		}
		n := 0
		lines := strings.Split(string(b[from:]), "\n")
		for _, line := range lines[:len(lines)-1] { // whole lines only
			if wrote, marker, read, ok := vmtest.RWLine(line); ok && marker == "ca-1" && read == wrote {
				n++
			}
		}
		return n
	}
	// Not vmtest.WaitConsole: a guest that stops (a failed boot) ends
	// vm run, which alive reports at once.
	var line string
	testcluster.Eventually(t, 4*time.Minute, "the guest to write its marker to its disk", func() bool {
		alive()
		b, _ := os.ReadFile(rec.Console)
		lines := strings.Split(string(b), "\n")
		for _, l := range lines[:len(lines)-1] { // whole lines only: the last may be half written
			if l = strings.TrimRight(l, "\r"); strings.HasPrefix(l, vmtest.Wrote) {
				line = l
				return true
			}
		}
		return false
	})
	if line != vmtest.Wrote+" ca-1" {
		t.Fatalf("the guest wrote %q to its disk, want its marker", line)
	}
	testcluster.Eventually(t, 2*time.Minute, "the guest to write its disk and read it back", func() bool {
		alive()
		return rw(0) > 0
	})

	newCA := c.RotateCA()
	c.Heartbeat()
	testcluster.Eventually(t, 30*time.Second, "the VM's record to list the rotated CA certificates", func() bool {
		alive()
		rec, err := vm.LoadRecord(state, "guest")
		return err == nil && slices.Contains(rec.CACertificates, fingerprint(newCA))
	})
	restartUnderNewCA(ctx, t, c, newCA)

	// The guest writes and reads its disk again: the supervisor
	// redialled the parts. The second write counted began after the
	// first one's line, so after the lender's restart.
	st, err := os.Stat(rec.Console)
	if err != nil {
		t.Fatal(err)
	}
	from := st.Size()
	testcluster.Eventually(t, 2*time.Minute, "the guest to write and read back its disk twice after the lender's restart", func() bool {
		alive()
		return rw(from) >= 2
	})

	// The supervisor reads its lease from the restarted control plane:
	// releasing it stops the VM.
	if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-finished:
	case <-time.After(time.Minute):
		t.Fatalf("the VM still runs a minute after its lease's release: %s", errb.String())
	}
	if want := "lease " + l.ID + " is released"; code == 0 || !strings.Contains(errb.String(), want) {
		t.Fatalf("vm run exited %d, saying %q; want it to say %q", code, errb.String(), want)
	}
}
