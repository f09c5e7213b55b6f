package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	memclient "github.com/rialto-project/rialto/internal/dataplane/memory/client"
)

// TestCommitWithNoTimeLeft: a part moved here whose commit brings a
// lease's expiry that has passed by the time it arrives (counted, as a
// prepare's, from its bound before it arrived) is committed, made the
// lease's export (the commit answers its URI), but not served, not for a
// single request, as a prepare with no time left: a borrower's client
// reaches nothing. An answer that shows the lease's expiry, passed,
// keeps it so; one that shows it renewed serves it, with the bytes
// moved. The commit served it, and only the heartbeat loop's next stop
// (held off here, as it is while the loop is busy with other work)
// stopped it.
func TestCommitWithNoTimeLeft(t *testing.T) {
	const size = 4 << 20
	data := bytes.Repeat([]byte("moved "), 4096/6+1)[:4096]
	for _, tc := range []struct {
		name string
		dev  DeviceConfig
		// write writes p at 0 through the part's URI on the source.
		write func(t *testing.T, uri string, p []byte)
		// read reads n bytes at 0 through uri as a borrower does; an
		// error: nothing was served.
		read func(t *testing.T, uri string, n int) ([]byte, error)
	}{
		{
			name:  "block",
			dev:   DeviceConfig{Name: "dev0", Kind: api.KindBlock, Path: "disk0.img", Size: 2 * size},
			write: func(t *testing.T, uri string, p []byte) { nbdWrite(t, uri, p, 0) },
			read: func(t *testing.T, uri string, n int) ([]byte, error) {
				c, err := nbd.DialURI(ctxFor(t), uri)
				if err != nil {
					return nil, err
				}
				defer c.Close()
				p := make([]byte, n)
				_, err = c.ReadAtContext(ctxFor(t), p, 0)
				return p, err
			},
		},
		{
			name: "memory",
			dev:  DeviceConfig{Name: "dev0", Kind: api.KindMemory, Size: 2 * size},
			write: func(t *testing.T, uri string, p []byte) {
				addr, cred := memoryTarget(t, uri)
				mc, err := memclient.Dial(ctxFor(t), addr, cred, memclient.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer mc.Close()
				if err := mc.Write(ctxFor(t), memclient.ChannelSync, p, 0); err != nil {
					t.Fatal(err)
				}
			},
			read: func(t *testing.T, uri string, n int) ([]byte, error) {
				addr, cred := memoryTarget(t, uri)
				mc, err := memclient.Dial(ctxFor(t), addr, cred, memclient.Options{})
				if err != nil {
					return nil, err
				}
				defer mc.Close()
				p := make([]byte, n)
				return p, mc.Read(ctxFor(t), memclient.ChannelSync, p, 0)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, srv := newFakeCP(t)
			clk := clock.NewFake(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
			cpNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // the control plane's clock
			cfg := func(name string) Config {
				return Config{ControlPlane: srv.URL, BootstrapToken: "boot", Name: name, StateDir: t.TempDir(),
					Devices: []DeviceConfig{tc.dev}}
			}
			src := start(t, cfg("src")).a
			dcfg := cfg("dst")
			dcfg.Clock = clk
			dst := start(t, dcfg).a
			ctx := ctxFor(t)
			part := api.PrepareRequest{LeaseID: "lease-m", Kind: tc.dev.Kind, DeviceName: "dev0", Length: size, Export: "x_lease-m"}
			prep, err := src.Prepare(ctx, part)
			if err != nil {
				t.Fatal(err)
			}
			tc.write(t, prep.URI, data)

			const id = "h1"
			moved := part
			moved.Export = "x_lease-m.moved"
			in, err := dst.ReceiveTransfer(ctx, api.TransferInRequest{ID: id, Token: "tok_" + id, Part: moved,
				ExpiresAt: cpNow.Add(time.Hour), Now: cpNow})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := src.SendTransfer(ctx, api.TransferOutRequest{ID: id, LeaseID: "lease-m", Export: "x_lease-m", DestURI: in.URI}); err != nil {
				t.Fatal(err)
			}
			waitTransfer(t, src, id, api.TransferReady)
			if _, err := src.SealTransfer(ctx, id); err != nil {
				t.Fatal(err)
			}

			// The lease has a second left by the control plane's clock,
			// less than the commit's bound (2 s): no time left here.
			// The heartbeat loop's stops wait meanwhile: what is seen is
			// what the commit left.
			dst.enforceMu.Lock()
			cr, err := dst.CommitTransfer(ctx, id, api.TransferCommitRequest{ExpiresAt: cpNow.Add(time.Second), Now: cpNow, TimeoutSeconds: 2})
			if err != nil {
				dst.enforceMu.Unlock()
				t.Fatal(err)
			}
			if cr.URI == "" {
				dst.enforceMu.Unlock()
				t.Fatal("committed without a URI")
			}
			got, err := tc.read(t, cr.URI, len(data))
			dst.enforceMu.Unlock()
			if err == nil {
				t.Fatalf("a part committed with no time left on its lease is served (read %q...)", got[:6])
			}
			if st, _ := dst.Transfer(id); st.State != api.TransferCommitted {
				t.Errorf("the destination's transfer is %s, want committed", st.State)
			}
			if n := testutil.ToFloat64(dst.mWithheld.WithLabelValues("suspended")); n != 1 {
				t.Errorf("%v exports suspended, want 1", n)
			}
			if n := testutil.ToFloat64(dst.mTransfers.WithLabelValues("in", "held")); n != 1 {
				t.Errorf("%v commits held back, want 1", n)
			}
			if got := dst.Leases(); len(got) != 1 || got[0] != "lease-m" {
				t.Errorf("the destination reports %v, want lease-m (the answers judge it)", got)
			}
			if _, err := src.CommitTransfer(ctx, id, api.TransferCommitRequest{}); err != nil {
				t.Fatal(err)
			}

			// The answer shows the lease's expiry, passed: still not served.
			cp.set(func(f *fakeCP) {
				f.now = cpNow.Add(time.Second)
				f.expires = map[string]time.Time{"lease-m": cpNow.Add(time.Second)}
			})
			if err := dst.Heartbeat(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := tc.read(t, cr.URI, len(data)); err == nil {
				t.Fatal("served without a renewal")
			}
			// Renewed: served, with what moved.
			cp.set(func(f *fakeCP) { f.expires["lease-m"] = cpNow.Add(time.Hour) })
			if err := dst.Heartbeat(ctx); err != nil {
				t.Fatal(err)
			}
			got, err = tc.read(t, cr.URI, len(data))
			if err != nil {
				t.Fatalf("not served once renewed: %v", err)
			}
			if !bytes.Equal(got, data) {
				t.Errorf("the moved part reads %q..., want %q...", got[:6], data[:6])
			}
		})
	}
}

// TestCommitRetriedWithTimeLeft: a commit with no time left that fails
// after the driver made the part its export, not served (here: the
// exports file cannot be written), leaves the transfer receiving; the
// control plane's next commit, which brings time left (the lease renewed),
// serves it. The driver, asked again, kept the export suspended while the
// agent recorded it served: nothing served it until the next stop and
// renewal.
func TestCommitRetriedWithTimeLeft(t *testing.T) {
	_, srv := newFakeCP(t)
	clk := clock.NewFake(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	cpNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	src := start(t, moveConfig(srv.URL, t.TempDir(), "src")).a
	dcfg := moveConfig(srv.URL, t.TempDir(), "dst")
	dcfg.Clock = clk
	dst := start(t, dcfg).a
	ctx := ctxFor(t)
	data := bytes.Repeat([]byte("moved "), 4096/6+1)[:4096]
	nbdWrite(t, prepareBlock(t, src, "lease-m", 0, movePart), data, 0)
	const id = "h2"
	startBlockMove(t, src, dst, id, 0, api.TransferOutRequest{})
	waitTransfer(t, src, id, api.TransferReady)
	if _, err := src.SealTransfer(ctx, id); err != nil {
		t.Fatal(err)
	}

	// exports.json cannot be written (a non-empty directory in its place).
	exports := filepath.Join(dcfg.StateDir, exportsFile)
	if err := os.Remove(exports); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(exports, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.CommitTransfer(ctx, id, api.TransferCommitRequest{ExpiresAt: cpNow.Add(time.Second), Now: cpNow, TimeoutSeconds: 2}); err == nil {
		t.Fatal("a commit whose export could not be recorded succeeded")
	}
	if st, _ := dst.Transfer(id); st.State != api.TransferReceiving {
		t.Fatalf("the destination's transfer after the failed commit is %s, want receiving", st.State)
	}
	if err := os.RemoveAll(exports); err != nil {
		t.Fatal(err)
	}
	dst.enforceMu.Lock() // what is seen is what the commit left
	cr, err := dst.CommitTransfer(ctx, id, api.TransferCommitRequest{ExpiresAt: cpNow.Add(time.Hour), Now: cpNow, TimeoutSeconds: 2})
	if err != nil {
		dst.enforceMu.Unlock()
		t.Fatal(err)
	}
	served := served(t, cr.URI)
	dst.enforceMu.Unlock()
	if !served {
		t.Fatal("the part committed again with time left is not served")
	}
	if got := nbdRead(t, cr.URI, len(data), 0); !bytes.Equal(got, data) {
		t.Errorf("the moved part reads %q..., want %q...", got[:6], data[:6])
	}
}
