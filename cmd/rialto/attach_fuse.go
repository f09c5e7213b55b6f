package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/block/fusefile"
	"github.com/rialto-project/rialto/internal/resource"
)

// fuseProcs is the GOMAXPROCS of an attach that serves FUSE.
const fuseProcs = 8

// attachFUSE serves block lease l (parts parts) as the file DIR/disk of a
// FUSE mount at dir, until Ctrl-C, detach or the lease's end: the attach
// process is then the FUSE server and the parts' NBD client at once.
func attachFUSE(ctx context.Context, e *env, c *api.Client, cf *clientFlags, l api.Lease, dir string, cfg borrower.AttachConfig, parts int, watch time.Duration) error {
	file, ctlPath, ctl, err := openAttachment(ctx, e, l.ID)
	if err != nil {
		return err
	}
	defer ctl.Close()
	bar := newProgress(e, -1, fmt.Sprintf("attach: connecting to %d %s of lease %s", parts, profPlural(parts, "part"), l.ID))
	vol, err := borrower.OpenVolume(ctx, c, l, cfg)
	bar.done()
	if err != nil {
		os.Remove(ctlPath)
		return fmt.Errorf("attach %s: %w", l.ID, err)
	}
	m, err := fusefile.Serve(vol, fusefile.Config{Dir: dir, FsName: "rialto:" + l.ID, Logger: cfg.Logger})
	if err != nil {
		vol.Close()
		os.Remove(ctlPath)
		return fmt.Errorf("attach %s: %w", l.ID, err)
	}
	// The FUSE server's readers wait for the kernel's requests in read(2)
	// on /dev/fuse; with no more Ps than CPUs, the goroutines that carry
	// the lenders' replies wait longer for a P and threads hand work
	// around: more Ps cut the CPU of the attach process and its agent
	// under PostgreSQL by a tenth (docs/bench/pgbench.md). GOMAXPROCS in
	// the environment wins.
	if e.getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < fuseProcs {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(fuseProcs))
	}
	// Unmounted (no more writes), the volume flushes what no flush
	// covered before it closes, as the NBD export's Close does.
	closeAll := func() error { return errors.Join(m.Close(), vol.Shutdown()) }
	st := attachState{ID: l.ID, State: "attached", PID: os.Getpid(), File: m.Path(), Size: vol.Size(),
		Parts: parts, Control: ctlPath, Started: m.Started().UTC(), CACertificates: cf.caFingerprints(), CRLNumber: cf.crlNumber()}
	if err := recordAttachment(file, st); err != nil {
		closeAll()
		os.Remove(ctlPath)
		return err
	}
	if cf.json() {
		cf.print(e.stdout, st)
	} else {
		fmt.Fprintln(e.stdout, m.Path())
		fmt.Fprintf(e.stderr, "rialto attach: lease %s (%d %s, %s) served as the file above (`mount -o loop %s MNT`); unmount MNT, then `rialto detach %s` or Ctrl-C\n",
			l.ID, parts, profPlural(parts, "part"), resource.FormatSize(st.Size), m.Path(), l.ID)
	}
	return holdAttachment(ctx, c, l, ctl, file, ctlPath, watch, attachHooks{close: closeAll, detachable: m.Unmount, pending: volumeWaits(vol),
		ca:   cf.caFollower(c, cfg.Logger),
		gone: m.Done(), goneErr: fmt.Errorf("%s was unmounted; detached lease %s", dir, l.ID)})
}
