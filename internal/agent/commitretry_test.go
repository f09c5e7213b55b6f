package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
)

// Commits of a part moved here that fail, and the commits the control
// plane tries again: what a failed commit leaves is the part as it was
// received, so that the next one serves it as that one says.

const (
	retryPart   = 4 << 20
	retryExport = "x_lease-m.moved"
	retryID     = "r1"
)

// retryRig is a sealed move of lease-m's part (retryPart bytes of kind,
// holding retryData at 0) from src to dst, whose clock is a year ahead of
// the control plane's (cpNow): a commit whose expiry is a second after
// cpNow, with a bound of 2 s, leaves no time left there.
type retryRig struct {
	src, dst *running
	dcfg     Config
	kind     api.Kind
	in       api.TransferInResponse
	cpNow    time.Time
}

var retryData = bytes.Repeat([]byte("moved "), 4096/6+1)[:4096]

func newRetryRig(t *testing.T, kind api.Kind) *retryRig {
	t.Helper()
	_, srv := newFakeCP(t)
	dev := DeviceConfig{Name: "dev0", Kind: kind, Size: 2 * retryPart}
	if kind == api.KindBlock {
		dev.Path = "disk0.img"
	}
	cfg := func(name string) Config {
		return Config{ControlPlane: srv.URL, BootstrapToken: "boot", Name: name, StateDir: t.TempDir(),
			Devices: []DeviceConfig{dev}}
	}
	r := &retryRig{kind: kind, cpNow: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r.src = start(t, cfg("src"))
	r.dcfg = cfg("dst")
	r.dcfg.Clock = clock.NewFake(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	r.dst = start(t, r.dcfg)
	ctx := ctxFor(t)
	part := api.PrepareRequest{LeaseID: "lease-m", Kind: kind, DeviceName: "dev0", Length: retryPart, Export: "x_lease-m"}
	prep, err := r.src.a.Prepare(ctx, part)
	if err != nil {
		t.Fatal(err)
	}
	if err := writePart(t, kind, prep.URI, retryData); err != nil {
		t.Fatal(err)
	}
	moved := part
	moved.Export = retryExport
	r.in, err = r.dst.a.ReceiveTransfer(ctx, api.TransferInRequest{ID: retryID, Token: "tok_" + retryID, Part: moved,
		ExpiresAt: r.cpNow.Add(time.Hour), Now: r.cpNow})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.src.a.SendTransfer(ctx, api.TransferOutRequest{ID: retryID, LeaseID: "lease-m", Export: "x_lease-m", DestURI: r.in.URI}); err != nil {
		t.Fatal(err)
	}
	waitTransfer(t, r.src.a, retryID, api.TransferReady)
	if _, err := r.src.a.SealTransfer(ctx, retryID); err != nil {
		t.Fatal(err)
	}
	return r
}

// commit commits the move at the destination, with time left on the
// lease or with none.
func (r *retryRig) commit(t *testing.T, timeLeft bool) (api.TransferCommitResponse, error) {
	exp := r.cpNow.Add(time.Second)
	if timeLeft {
		exp = r.cpNow.Add(time.Hour)
	}
	return r.dst.a.CommitTransfer(ctxFor(t), retryID, api.TransferCommitRequest{ExpiresAt: exp, Now: r.cpNow, TimeoutSeconds: 2})
}

// movedURI is where the destination serves the part once committed.
func (r *retryRig) movedURI() string {
	return strings.Replace(r.in.URI, "tok_"+retryID, retryExport, 1)
}

// wantReceiving checks that the destination's transfer is receiving (a
// failed commit left it so, for the next commit or the abort).
func (r *retryRig) wantReceiving(t *testing.T) {
	t.Helper()
	if st, _ := r.dst.a.Transfer(retryID); st.State != api.TransferReceiving {
		t.Fatalf("the destination's transfer after the failed commit is %s, want receiving", st.State)
	}
}

// writePart writes p at 0 through uri, a borrower's URI of a kind part.
func writePart(t *testing.T, kind api.Kind, uri string, p []byte) error {
	t.Helper()
	if kind == api.KindBlock {
		c, err := nbd.DialURI(ctxFor(t), uri)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.WriteAtContext(ctxFor(t), p, 0, true)
		return err
	}
	addr, cred := memoryTarget(t, uri)
	mc, err := memclient.Dial(ctxFor(t), addr, cred, memclient.Options{})
	if err != nil {
		return err
	}
	defer mc.Close()
	return mc.Write(ctxFor(t), memclient.ChannelSync, p, 0)
}

// readPart reads n bytes at 0 through uri as a borrower does; an error:
// nothing is served there.
func readPart(t *testing.T, kind api.Kind, uri string, n int) ([]byte, error) {
	t.Helper()
	p := make([]byte, n)
	if kind == api.KindBlock {
		c, err := nbd.DialURI(ctxFor(t), uri)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		_, err = c.ReadAtContext(ctxFor(t), p, 0)
		return p, err
	}
	addr, cred := memoryTarget(t, uri)
	mc, err := memclient.Dial(ctxFor(t), addr, cred, memclient.Options{})
	if err != nil {
		return nil, err
	}
	defer mc.Close()
	return p, mc.Read(ctxFor(t), memclient.ChannelSync, p, 0)
}

// wantServed checks that the committed part is served at uri with the
// moved bytes. The heartbeat loop's stops wait meanwhile: what is seen is
// what the commit left.
func (r *retryRig) wantServed(t *testing.T, uri string) {
	t.Helper()
	r.dst.a.enforceMu.Lock()
	got, err := readPart(t, r.kind, uri, len(retryData))
	r.dst.a.enforceMu.Unlock()
	if err != nil {
		t.Fatalf("the committed part is not served: %v", err)
	}
	if !bytes.Equal(got, retryData) {
		t.Fatalf("the committed part reads %q..., want %q...", got[:6], retryData[:6])
	}
}

// TestMemoryCommitRetriedServesRegionAFailedHoldSuspended: a memory
// commit with no time left suspends the received region, then fails to
// serve it under the lease's credential (a region holds that credential
// already); the commit tried again, with time left, serves it: a
// borrower reads the moved bytes at the URI it answers.
func TestMemoryCommitRetriedServesRegionAFailedHoldSuspended(t *testing.T) {
	r := newRetryRig(t, api.KindMemory)
	d := r.dst.a.drivers[api.KindMemory].(*MemoryDriver).donor
	if err := d.AddRegion(retryExport, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := r.commit(t, false); err == nil {
		t.Fatal("a commit whose region could not take the lease's credential succeeded")
	}
	r.wantReceiving(t)
	if err := d.RemoveRegion(retryExport); err != nil {
		t.Fatal(err)
	}
	cr, err := r.commit(t, true)
	if err != nil {
		t.Fatal(err)
	}
	r.wantServed(t, cr.URI)
}

// TestBlockCommitRetriedAddsTheExport: a block commit whose lease export
// cannot be added to the NBD server (a name already served there: a real
// AddExport, or AddSuspendedExport with no time left, that fails) leaves
// the part as received; the commit tried again adds the export, and a
// borrower reads the moved bytes at the URI it answers.
func TestBlockCommitRetriedAddsTheExport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		timeLeft bool // the first commit's
	}{{"served", true}, {"held", false}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRetryRig(t, api.KindBlock)
			srv := &r.dst.a.drivers[api.KindBlock].(*BlockDriver).srv
			if err := srv.AddExport(nbd.Export{Name: retryExport, Backend: nbd.NewMemBackend(4096)}); err != nil {
				t.Fatal(err)
			}
			if _, err := r.commit(t, tc.timeLeft); err == nil {
				t.Fatal("a commit whose export could not be added succeeded")
			}
			r.wantReceiving(t)
			if err := srv.RemoveExport(retryExport); err != nil {
				t.Fatal(err)
			}
			cr, err := r.commit(t, true)
			if err != nil {
				t.Fatal(err)
			}
			r.wantServed(t, cr.URI)
		})
	}
}

// TestFailedCommitLeavesThePartReceived: a commit that fails after the
// driver served the part (the exports file cannot be written) leaves it
// as received: not served, not reported as the lease's, and the abort
// that follows wipes it and leaves nothing of it, its range lendable
// again.
func TestFailedCommitLeavesThePartReceived(t *testing.T) {
	for _, kind := range []api.Kind{api.KindBlock, api.KindMemory} {
		t.Run(string(kind), func(t *testing.T) {
			r := newRetryRig(t, kind)
			dst := r.dst.a
			// exports.json cannot be written (a non-empty directory in
			// its place).
			exports := filepath.Join(r.dcfg.StateDir, exportsFile)
			if err := os.Remove(exports); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(exports, "x"), 0o700); err != nil {
				t.Fatal(err)
			}
			dst.enforceMu.Lock() // what is seen is what the commit left
			_, err := r.commit(t, true)
			leases := dst.Leases()
			_, readErr := readPart(t, kind, r.movedURI(), len(retryData))
			dst.enforceMu.Unlock()
			if err == nil {
				t.Fatal("a commit whose export could not be recorded succeeded")
			}
			r.wantReceiving(t)
			if readErr == nil {
				t.Error("the part of a failed commit is served")
			}
			if len(leases) != 0 {
				t.Errorf("after a failed commit the destination reports %v, want none", leases)
			}
			if err := os.RemoveAll(exports); err != nil {
				t.Fatal(err)
			}

			if _, err := dst.AbortTransfer(ctxFor(t), retryID); err != nil {
				t.Fatal(err)
			}
			if got := dst.Leases(); len(got) != 0 {
				t.Errorf("after the abort the destination reports %v, want none", got)
			}
			if _, err := dst.Prepare(ctxFor(t), api.PrepareRequest{LeaseID: "lease-n", Kind: kind, DeviceName: "dev0",
				Length: retryPart, Export: "x_lease-n"}); err != nil {
				t.Errorf("the aborted part's range is not lendable again: %v", err)
			}
		})
	}
}

// TestFailedCommitLeavesNoExportToRestore: a commit that fails after the
// exports file listed the part served (the wipe journal cannot be
// written) takes it back out: once the abort has wiped the range, a
// restart restores nothing of it.
func TestFailedCommitLeavesNoExportToRestore(t *testing.T) {
	r := newRetryRig(t, api.KindBlock)
	dst := r.dst.a
	wipes := filepath.Join(r.dcfg.StateDir, wipesFile)
	journal, err := os.ReadFile(wipes)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(wipes); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(wipes, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := r.commit(t, true); err == nil {
		t.Fatal("a commit whose range could not leave the wipe journal succeeded")
	}
	r.wantReceiving(t)
	if err := os.RemoveAll(wipes); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wipes, journal, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.AbortTransfer(ctxFor(t), retryID); err != nil {
		t.Fatal(err)
	}
	r.dst.halt(t)
	if got := start(t, r.dcfg).a.Leases(); len(got) != 0 {
		t.Errorf("after a restart the destination restored %v, want none", got)
	}
}
