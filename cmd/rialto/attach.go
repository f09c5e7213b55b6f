package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	register(&command{Name: "attach", Args: "LEASE", Summary: "Serve a block lease (composed or not) or a memory lease as a local NBD export or, with --fuse, a block lease as a file to loop-mount, or attach a nic lease (a bond or not) as a network interface, until Ctrl-C or detach.", Flags: runAttach, MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "detach", Args: "LEASE", Summary: "Stop the `rialto attach` of a lease and wait until it is gone.", Flags: runDetach, MinArgs: 1, MaxArgs: 1})
}

// attachState is what attach records for detach: one file per lease,
// LEASE.json (0600, it holds the local URI, which names a secret export),
// beside a control socket LEASE.ctl on which attach accepts "detach" (and
// answers "pending" with the parts whose lenders have not answered writes).
type attachState struct {
	ID    string `json:"id"`
	State string `json:"state"`
	PID   int    `json:"pid"`
	URI   string `json:"uri,omitempty"`
	// File is the lease as a file in a FUSE mount (--fuse).
	File    string    `json:"file,omitempty"`
	Size    int64     `json:"size"` // bytes (block); bytes/s (nic: the lease's rate)
	Parts   int       `json:"parts"`
	Control string    `json:"control"`
	Started time.Time `json:"started"`
	// WriteBack: plain writes are acknowledged before the lenders'
	// replies (--write-back).
	WriteBack bool `json:"write_back,omitempty"`
	// A nic lease's interface, its address and what it routes.
	Iface  string   `json:"iface,omitempty"`
	Addr   string   `json:"addr,omitempty"`
	Routes []string `json:"routes,omitempty"`
	// CACertificates are the SHA-256 fingerprints (hex, as `rialto ca
	// show` prints them) of the CA certificates the attachment verifies
	// the control plane and lenders with: those of --cacert, or the
	// control plane's since a CA rotation (caFollower).
	CACertificates []string `json:"ca_certificates,omitempty"`
	// CRLNumber is the number of the revocation list the attachment
	// refuses lenders with (0: none): that beside --cacert, or the
	// control plane's when newer (caFollower).
	CRLNumber int64 `json:"crl_number,omitempty"`
}

// attachDir is where attachments are recorded: $XDG_RUNTIME_DIR/rialto, or
// ~/.rialto/attach without one.
func attachDir(e *env) (string, error) {
	if d := e.getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "rialto"), nil
	}
	home := e.getenv("HOME")
	if home == "" {
		var err error
		if home, err = os.UserHomeDir(); err != nil {
			return "", fmt.Errorf("no XDG_RUNTIME_DIR and no home directory for the attach state: %w", err)
		}
	}
	return filepath.Join(home, ".rialto", "attach"), nil
}

// statePaths returns the state file and control socket of a lease.
func statePaths(dir, lease string) (file, ctl string, err error) {
	if lease == "" || strings.ContainsAny(lease, "/\\") || lease == "." || lease == ".." {
		return "", "", fmt.Errorf("bad lease ID %q", lease)
	}
	return filepath.Join(dir, lease+".json"), filepath.Join(dir, lease+".ctl"), nil
}

func readAttachState(file string) (attachState, error) {
	var st attachState
	b, err := os.ReadFile(file)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", file, err)
	}
	return st, nil
}

// processAlive reports whether pid names a running (not zombie) process.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !os.IsNotExist(err)
	}
	// pid (comm) S ...: the state follows the last ')'.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

func runAttach(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	listen := fs.String("listen", "", "serve on this loopback TCP `ADDR` (e.g. 127.0.0.1:0) instead of the private Unix socket: then any local user who learns the URI (a command line in `ps` shows it) can connect and read or write the lease")
	socket := fs.String("socket", "", "serve on the Unix socket `PATH` (created 0600) instead of LEASE.nbd in the private attach state directory ($XDG_RUNTIME_DIR/rialto, or ~/.rialto/attach)")
	fuseDir := fs.String("fuse", "", "block: serve the lease as the file DIR/disk in a FUSE mount at the empty directory `DIR`, instead of over NBD (then: mount -o loop DIR/disk MNT)")
	unit := sizeString(fs, "stripe-unit", "", "stripe unit, e.g. 128KiB (default: the lease's)")
	conns := fs.Int("conns", 0, "NBD connections to each part (default 2); nic: tunnel connections to each lender (default 1, 2 with --bond-mode packet)")
	var nf nicAttachFlags
	nf.register(fs)
	writeBack := fs.Bool("write-back", false, "block: acknowledge a plain write once sent to its lenders, before their replies (faster writes, slower FLUSH; FLUSH and FUA stay durable; docs/composition.md)")
	timeout := fs.Duration("timeout", 0, "declare a part failed when a request takes longer (default 30s)")
	watch := fs.Duration("watch", 5*time.Second, "how often to check that the lease is still active, and with --cacert whether the control plane's CA certificates changed (a CA rotation: attach verifies with them from then on) (0: never)")
	level := fs.String("log-level", "warn", "debug, info, warn or error")
	return func(ctx context.Context, pos []string) error {
		switch {
		case *conns < 0:
			return usagef("bad --conns %d: a number of connections, 0 for the default", *conns)
		case *timeout < 0:
			return usagef("bad --timeout %v: a duration, 0 for the default", *timeout)
		}
		log, err := newLogger(e, *level)
		if err != nil {
			return err
		}
		// The CA certificates follow a CA rotation while attach runs
		// (holdAttachment asks the control plane at each --watch).
		if err := cf.followRoots(); err != nil {
			return err
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		dataTLS, err := cf.dataTLSFunc()
		if err != nil {
			return err
		}
		l, err := c.Lease(ctx, pos[0])
		if err != nil {
			return err
		}
		if l.State != api.LeaseActive {
			return notActive(l)
		}
		if *fuseDir != "" && l.Kind != api.KindBlock {
			return usagef("--fuse serves block leases; lease %s is %s %s lease", l.ID, l.Kind.Article(), l.Kind)
		}
		if l.Kind == api.KindNIC {
			return attachNIC(ctx, e, c, &cf, l, nf, *conns, dataTLS, *watch, log)
		}
		if l.Kind == api.KindAccel {
			return fmt.Errorf("lease %s is an accel lease; attach serves block, memory and nic leases: run an accelerator lease's role with `rialto accel run %s ROLE INPUT`", l.ID, l.ID)
		}
		parts, err := borrower.AttachParts(l)
		if err != nil {
			return err
		}
		su := l.StripeUnit
		if *unit != "" {
			if su, err = resource.ParseSize(*unit); err != nil {
				return usagef("bad --stripe-unit: %w", err)
			}
			if l.StripeUnit > 0 && su != l.StripeUnit && parts > 1 {
				fmt.Fprintf(e.stderr, "rialto attach: warning: stripe unit %s differs from the lease's %s; data written with one is scrambled under the other\n",
					resource.FormatSize(su), resource.FormatSize(l.StripeUnit))
			}
		}
		if *fuseDir != "" {
			switch {
			case *writeBack:
				return usagef("--fuse and --write-back do not go together (the write-back cache belongs to the NBD export)")
			case *socket != "" || fs.Changed("listen"):
				return usagef("--fuse serves no NBD export: drop --listen and --socket")
			}
			return attachFUSE(ctx, e, c, &cf, l, *fuseDir, borrower.AttachConfig{StripeUnit: su, ConnsPerPart: *conns, RequestTimeout: *timeout, TLS: dataTLS,
				Track: cf.dataTrack(log), Logger: log}, parts, *watch)
		}
		if *socket != "" && *listen != "" {
			return usagef("--listen and --socket do not go together: one serves on TCP, the other on a Unix socket")
		}
		where, sockPath := *listen, ""
		if *socket != "" {
			if sockPath, err = filepath.Abs(*socket); err != nil {
				return err
			}
			where = "unix:" + sockPath
		}

		file, ctlPath, ctl, err := openAttachment(ctx, e, l.ID)
		if err != nil {
			return err
		}
		defer ctl.Close()
		if sockPath != "" {
			if err := clearStaleSocket(ctx, sockPath); err != nil {
				os.Remove(ctlPath)
				return err
			}
		}
		// By default the export is a Unix socket beside the control socket,
		// in the attachment's own 0700 directory, created 0600: only its
		// user (and root) connects, whoever learns the URI. Over TCP,
		// anyone on the machine who learns it can.
		if where == "" {
			where = "unix:" + attachSocket(filepath.Dir(ctlPath), l.ID)
		}

		// A part whose lender restarted at another address is redialled at
		// the URI the control plane has for it now.
		bar := newProgress(e, -1, fmt.Sprintf("attach: connecting to %d %s of lease %s", parts, profPlural(parts, "part"), l.ID))
		att, err := borrower.Attach(ctx, c, l, borrower.AttachConfig{Listen: where, StripeUnit: su,
			ConnsPerPart: *conns, RequestTimeout: *timeout, TLS: dataTLS, Track: cf.dataTrack(log), WriteBack: *writeBack, Logger: log})
		bar.done()
		if err != nil {
			os.Remove(ctlPath)
			return fmt.Errorf("attach %s: %w", l.ID, err)
		}
		st := attachState{ID: l.ID, State: "attached", PID: os.Getpid(), URI: att.URI(), Size: att.Volume().Size(),
			Parts: parts, Control: ctlPath, Started: time.Now().UTC(), WriteBack: att.WriteBack(), CACertificates: cf.caFingerprints(), CRLNumber: cf.crlNumber()}
		if err := recordAttachment(file, st); err != nil {
			att.Close()
			os.Remove(ctlPath)
			return err
		}
		if cf.json() {
			cf.print(e.stdout, st)
		} else {
			fmt.Fprintln(e.stdout, att.URI())
			cache := ""
			if st.WriteBack {
				cache = ", write-back (durable at FLUSH or FUA)"
			}
			fmt.Fprintf(e.stderr, "rialto attach: lease %s (%d %s, %s%s) served at the URI above; Ctrl-C or `rialto detach %s` ends it\n",
				l.ID, parts, profPlural(parts, "part"), resource.FormatSize(st.Size), cache, l.ID)
		}
		// Close removes the socket.
		return holdAttachment(ctx, c, l, ctl, file, ctlPath, *watch, attachHooks{close: att.Close, pending: volumeWaits(att.Volume()),
			ca: cf.caFollower(c, log)})
	}
}

// attachSocket is where attach serves lease id by default: ID.nbd in dir,
// the attach state directory, beside the control socket (so no longer a
// path than the one already bound). openAttachment made dir 0700 and
// removed a stale socket a killed attach of the lease left there.
func attachSocket(dir, id string) string {
	return filepath.Join(dir, id+".nbd")
}

// attachHooks are what holdAttachment calls on an attachment.
type attachHooks struct {
	// close ends the attachment.
	close func() error
	// follow, if set, is handed each lease record read while watching.
	follow func(api.Lease)
	// detachable, if set, is asked on `rialto detach`: an error refuses
	// the detach (the asker gets it) and the attachment stays.
	detachable func() error
	// gone, if set, is closed when the attachment ended by itself (its
	// FUSE mount was unmounted from outside).
	gone <-chan struct{}
	// goneErr is what holdAttachment returns then.
	goneErr error
	// ca, if set, is asked at each watch for CA certificates that changed
	// (a CA rotation) and a newer revocation list; those in use are
	// recorded in the state file.
	ca *caFollower
	// pending, if set, returns per part (in layout order) what its lender
	// has not answered (writes, the final flush): what a "pending" on the
	// control socket is answered with (detach asks when the attachment did
	// not end in time).
	pending func() []partWait
}

// partWait is what a part's lender has not answered yet.
type partWait struct {
	// writes is how many writes (trims, zeroings) it has not answered.
	writes int64
	// flush: the close's final flush, sent once every write was
	// answered, was not answered.
	flush bool
}

// unansweredReporter is what a volume (stripe.Volume) says of what its
// parts' lenders have not answered.
type unansweredReporter interface {
	UnansweredWrites() []int64
	UnansweredFinalFlush() []bool
}

// volumeWaits is the pending hook of an attachment of v.
func volumeWaits(v unansweredReporter) func() []partWait {
	return func() []partWait {
		w, f := v.UnansweredWrites(), v.UnansweredFinalFlush()
		ws := make([]partWait, len(w))
		for i := range ws {
			ws[i].writes = w[i]
			ws[i].flush = i < len(f) && f[i]
		}
		return ws
	}
}

// holdAttachment keeps an attachment (its state in file, its control
// socket ctl at ctlPath) until ctx ends, `rialto detach` asks on the
// control socket (and h.detachable agrees), the attachment ends by itself
// (h.gone), or the lease ends (checked every watch; 0: never); then it
// closes the attachment with h.close, removes its state and answers
// detach. It returns why the lease or the attachment ended, if it did.
func holdAttachment(ctx context.Context, c *api.Client, l api.Lease, ctl net.Listener, file, ctlPath string, watch time.Duration, h attachHooks) error {
	// The lease's latest record: which lender a part is on now.
	var rec atomic.Pointer[api.Lease]
	rec.Store(&l)
	// Its lenders' node names (the nodes list, the names the control
	// plane's own messages give lenders): detach names a part's lender by
	// them. Read now, and again when a record names a node not in them
	// (a part moved). Unknown, a lender is named by its node's ID.
	var names atomic.Pointer[map[string]string]
	learnNames := func(l api.Lease) {
		if c == nil || knowsLenders(names.Load(), l) {
			return
		}
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m := nodeNames(nctx, c)
		cancel()
		names.Store(&m)
	}
	learnNames(l)
	// The CA certificates the attachment verifies with and the number of
	// the revocation list it refuses lenders with, once they changed (the
	// kinds record those of its start: caFingerprints, crlNumber), for an
	// operator to check that it follows a rotation and the revocations
	// (docs/operations.md).
	recordCAs := func() {
		st, err := readAttachState(file)
		if err == nil {
			st.CACertificates, st.CRLNumber = h.ca.fingerprints(), h.ca.crlNumber()
			err = recordAttachment(file, st)
		}
		if err != nil {
			h.ca.log.Warn("recording the CA certificates in use", "err", err)
		}
	}
	// Serve until the context ends or detach asks on the control socket.
	// A detach asked once the attachment is closing (another `rialto
	// detach`, waiting longer) is held in late, the accept loop's until it
	// ends, and answered as the first.
	detach := make(chan net.Conn)
	quit := make(chan struct{})
	acceptDone := make(chan struct{})
	var late []net.Conn
	go func() {
		defer close(acceptDone)
		for {
			conn, err := ctl.Accept()
			if err != nil {
				return
			}
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			line, _ := bufio.NewReader(conn).ReadString('\n')
			if strings.TrimSpace(line) == "pending" && h.pending != nil {
				// Asked by detach while the attachment is closing: answered
				// until the control socket closes, once the close is done.
				ws := h.pending()
				var nm map[string]string
				if p := names.Load(); p != nil {
					nm = *p
				}
				fmt.Fprintf(conn, "pending %s %s\n", pendingKind(ws), pendingParts(*rec.Load(), ws, nm))
				conn.Close()
				continue
			}
			if strings.TrimSpace(line) != "detach" {
				// A probe (or junk): answer who we are and go on.
				fmt.Fprintf(conn, "attached %s\n", l.ID)
				conn.Close()
				continue
			}
			// Answered when the close ends, however long it takes (the
			// asker has a deadline of its own).
			conn.SetDeadline(time.Time{})
			select {
			case detach <- conn:
			case <-quit:
				late = append(late, conn)
			}
		}
	}()
	// Serve until Ctrl-C, detach, or the lease ends (then the lenders have
	// torn the parts down and every request would fail).
	var tick <-chan time.Time
	if watch > 0 {
		t := time.NewTicker(watch)
		defer t.Stop()
		tick = t.C
	}
	var asker net.Conn
	var ended error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-h.gone:
			ended = h.goneErr
			break wait
		case asker = <-detach:
			if h.detachable == nil {
				break wait
			}
			err := h.detachable()
			if err == nil {
				break wait
			}
			fmt.Fprintf(asker, "error %v\n", err)
			asker.Close()
			asker = nil
		case <-tick:
			if h.ca != nil && h.ca.check(ctx) {
				recordCAs()
			}
			cur, err := c.Lease(ctx, l.ID)
			if err == nil && cur.State.Terminal() {
				ended = fmt.Errorf("lease %s is %s%s; detached", l.ID, cur.State, leaseWhy(cur))
				break wait
			}
			if err == nil {
				rec.Store(&cur)
				learnNames(cur)
				if h.follow != nil {
					h.follow(cur)
				}
			}
			if api.IsCode(err, api.CodeNotFound) {
				ended = fmt.Errorf("lease %s is gone; detached", l.ID)
				break wait
			}
		}
	}
	close(quit)
	cerr := h.close()
	ctl.Close()
	<-acceptDone
	os.Remove(file)
	os.Remove(ctlPath)
	if asker != nil {
		late = append(late, asker)
	}
	for _, a := range late {
		if cerr != nil {
			// One line: detach reads one (errors.Join's have several).
			fmt.Fprintf(a, "error %s\n", strings.ReplaceAll(strings.TrimSpace(cerr.Error()), "\n", "; "))
		} else {
			fmt.Fprintln(a, "detached")
		}
		a.Close()
	}
	if cerr != nil && ended != nil {
		// Both: why the attachment ended, then what its close found (writes
		// the lease's end may have lost).
		return fmt.Errorf("%w; closing it: %w", ended, cerr)
	}
	if cerr != nil {
		return fmt.Errorf("detach %s: %w", l.ID, cerr)
	}
	return ended
}

// leaseWhy is " (REASON)" for a lease that carries one, else "".
func leaseWhy(l api.Lease) string {
	if l.Reason == "" {
		return ""
	}
	return " (" + l.Reason + ")"
}

// openAttachment claims lease id's attach state: its state file's path
// and its control socket, listening. A lease attached by a live process
// is refused.
func openAttachment(ctx context.Context, e *env, id string) (file, ctlPath string, ctl net.Listener, err error) {
	dir, err := attachDir(e)
	if err != nil {
		return "", "", nil, err
	}
	if err := privateDir(dir); err != nil {
		return "", "", nil, fmt.Errorf("attach state: %w", err)
	}
	file, ctlPath, err = statePaths(dir, id)
	if err != nil {
		return "", "", nil, err
	}
	old, rerr := readAttachState(file)
	if rerr != nil && !errors.Is(rerr, os.ErrNotExist) && controlAnswers(ctx, ctlPath) {
		// A damaged state file does not make a live attachment dead: its
		// control socket answers, and removing it and its NBD socket
		// would orphan that attachment (detach could no longer reach it)
		// and serve the lease twice.
		return "", "", nil, fmt.Errorf("lease %s is already attached by a live process, whose state file is unreadable (%w): run `rialto detach %s` first", id, rerr, id)
	}
	if rerr == nil && processAlive(old.PID) && controlAnswers(ctx, old.Control) {
		where := old.URI
		if old.Iface != "" {
			where = "interface " + old.Iface
		}
		if old.File != "" {
			where = old.File
		}
		return "", "", nil, fmt.Errorf("lease %s is already attached at %s by process %d (run `rialto detach %s` first)", id, where, old.PID, id)
	}
	// What a killed attach of the lease left: its control socket and its
	// NBD socket (attachSocket).
	os.Remove(ctlPath)
	os.Remove(attachSocket(dir, id))
	ctl, err = net.Listen("unix", ctlPath)
	if err != nil {
		return "", "", nil, fmt.Errorf("attach control socket: %w", err)
	}
	os.Chmod(ctlPath, 0o600)
	return file, ctlPath, ctl, nil
}

// clearStaleSocket readies path, an attach's --socket, to be bound: a
// socket nobody listens on (connect is refused: what a killed attach
// left) is removed. A socket some process listens on, or anything but a
// socket at path, is refused and left as it is.
func clearStaleSocket(ctx context.Context, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("--socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		what := "a file"
		if fi.IsDir() {
			what = "a directory"
		}
		return fmt.Errorf("--socket %s: %s is there, not a socket: name a path that does not exist", path, what)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "unix", path)
	if err == nil {
		conn.Close()
		return fmt.Errorf("--socket %s: another process listens on it (another attach?): stop it, or name another path", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("--socket %s: is it in use? %w", path, err)
	}
	// Nobody listens: a killed attach's socket.
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--socket %s: remove the stale socket: %w", path, err)
	}
	return nil
}

// privateDir makes dir, the attach state directory, if it is not there,
// and makes it 0700 if it is: it holds the state files (URIs naming
// secret exports) and the sockets of the exports. A directory another
// user owns (unless we are root: `sudo -E rialto attach` of a nic lease
// keeps the user's XDG_RUNTIME_DIR), or something else at dir, is refused.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() && os.Geteuid() != 0 {
		return fmt.Errorf("%s belongs to user %d, not to you (%d): set XDG_RUNTIME_DIR to a directory of your own", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// recordAttachment writes an attachment's state to file (mode 0600).
func recordAttachment(file string, st attachState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err == nil {
		err = writeFile0600(file, append(b, '\n'))
	}
	if err != nil {
		return fmt.Errorf("attach state: %w", err)
	}
	return nil
}

// writeFile0600 replaces path with b through a fresh temporary file of
// mode 0600 in its directory (os.CreateTemp: O_EXCL, so a file left at
// some fixed temporary name, of whatever mode, is never written into).
func writeFile0600(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// controlAnswers reports whether an attach process answers on ctl.
func controlAnswers(ctx context.Context, ctl string) bool {
	if ctl == "" {
		return false
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "unix", ctl)
	if err != nil {
		return false
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintln(conn, "probe")
	line, _ := bufio.NewReader(conn).ReadString('\n')
	return strings.HasPrefix(line, "attached ")
}

// pendingKind is what the close waits for, given what each part's lender
// has not answered: "writes" while a write is unanswered, "flush" once
// every write was answered and the final flush is not, "none" otherwise.
func pendingKind(ws []partWait) string {
	kind := "none"
	for _, w := range ws {
		if w.writes > 0 {
			return "writes"
		}
		if w.flush {
			kind = "flush"
		}
	}
	return kind
}

// knowsLenders reports whether names (node ID to name; nil: not read)
// has the node of every part of l.
func knowsLenders(names *map[string]string, l api.Lease) bool {
	if names == nil {
		return false
	}
	for _, p := range l.Parts {
		if p.NodeID != "" && (*names)[p.NodeID] == "" {
			return false
		}
	}
	return true
}

// pendingParts says which parts of lease l wait for their lenders, given
// per part (layout order) what its lender has not answered: "part 1
// (lender n2) has 3 writes unanswered; part 2 (lender n3) has not
// answered the final flush", "" if none. A part is named by its lender's
// node name (names: node ID to name), or its node's ID if names lacks it,
// or without a node by its lender's address: never by its URI, whose
// export name is a secret.
func pendingParts(l api.Lease, ws []partWait, names map[string]string) string {
	var ps []string
	for i, w := range ws {
		if w.writes <= 0 && !w.flush {
			continue
		}
		var part api.Part
		if i < len(l.Parts) {
			part = l.Parts[i]
		}
		if part.URI == "" && len(l.Parts) <= 1 {
			part.URI = l.URI
		}
		who := ""
		switch {
		case part.NodeID != "":
			who = fmt.Sprintf(" (lender %s)", nodeName(names, part.NodeID))
		case lenderAddr(part.URI) != "":
			who = fmt.Sprintf(" (lender at %s)", lenderAddr(part.URI))
		}
		if w.writes > 0 {
			ps = append(ps, fmt.Sprintf("part %d%s has %d %s unanswered", i, who, w.writes, profPlural(int(w.writes), "write")))
		}
		if w.flush {
			ps = append(ps, fmt.Sprintf("part %d%s has not answered the final flush", i, who))
		}
	}
	return strings.Join(ps, "; ")
}

// lenderAddr is the host:port of a part's URI ("" if it has none): not
// its path (the export name) nor anything else of it.
func lenderAddr(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return ""
	}
	return u.Host
}

// askPending asks the attach process on control what its close waits
// for: kind ("writes", "flush", or "" if it does not say) and which parts
// (pendingParts; "" if unknown). An attach process that answers without a
// kind (an older one) spoke of writes.
func askPending(ctx context.Context, control string) (kind, parts string) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "unix", control)
	if err != nil {
		return "", ""
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintln(conn, "pending")
	line, _ := bufio.NewReader(conn).ReadString('\n')
	rest, ok := strings.CutPrefix(line, "pending ")
	if !ok {
		return "", ""
	}
	rest = strings.TrimSpace(rest)
	first, tail, _ := strings.Cut(rest, " ")
	switch first {
	case "writes", "flush":
		return first, strings.TrimSpace(tail)
	case "none":
		return "", ""
	}
	return "writes", rest
}

// stillFlushing is detach's error when the attachment st has not ended
// within wait: it is waiting for its lenders to answer writes or, once
// they have, the final flush (kind, from askPending; "" if unknown: then
// writes are assumed); it ends once they have answered, or its own
// --timeout has passed. It says which parts wait (parts, from askPending;
// "" if unknown), what is safe and what the user can do.
func stillFlushing(st attachState, wait time.Duration, kind, parts string) error {
	which := fmt.Sprintf("(the lender named by `rialto lease show %s` whose part is slow or unreachable)", st.ID)
	if parts != "" {
		which = fmt.Sprintf("(%s; `rialto lease show %s` shows its parts)", parts, st.ID)
	}
	if kind == "flush" {
		return fmt.Errorf("detach %s: the attachment (process %d) has not ended after %v: every write was answered, and it is still waiting for a lender to answer the final flush "+
			"%s. The writes are on the lenders; those on a part whose lender has not answered the flush are not confirmed durable there "+
			"(a crash of that lender's machine could lose them). "+
			"It ends by itself once the lender answers or its own --timeout passes: run `rialto detach --timeout 10m %s` to wait longer, "+
			"or `kill %d` to stop waiting (the writes stay on the lenders, unconfirmed)",
			st.ID, st.PID, wait, which, st.ID, st.PID)
	}
	return fmt.Errorf("detach %s: the attachment (process %d) has not ended after %v: it is still waiting for a lender to answer a write "+
		"%s. Writes it acknowledged are on the lenders "+
		"(with --write-back: those before the last flush); a write not yet acknowledged is not. "+
		"It ends by itself once the lenders answer or its own --timeout passes: run `rialto detach --timeout 10m %s` to wait longer, "+
		"or `kill %d` to give up the writes not yet on the lenders",
		st.ID, st.PID, wait, which, st.ID, st.PID)
}

func runDetach(e *env, fs *pflag.FlagSet) runFunc {
	output := outputVar(fs)
	wait := fs.Duration("timeout", time.Minute, "how long to wait for the attachment to end (it waits up to its --timeout for the lenders to answer the writes it acknowledged, and flushes them)")
	return func(ctx context.Context, pos []string) error {
		dir, err := attachDir(e)
		if err != nil {
			return err
		}
		file, ctlPath, err := statePaths(dir, pos[0])
		if err != nil {
			return err
		}
		st, err := readAttachState(file)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("lease %s is not attached here (no %s)", pos[0], file)
		}
		if err != nil {
			if !controlAnswers(ctx, ctlPath) {
				return err
			}
			// A damaged state file: the attachment's control socket,
			// at its usual path, still answers; ask it to stop.
			st = attachState{ID: pos[0], Control: ctlPath}
		}
		if st.Control == "" {
			st.Control = ctlPath
		}
		deadline := time.Now().Add(*wait)
		dctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		var d net.Dialer
		conn, err := d.DialContext(dctx, "unix", st.Control)
		switch {
		case err == nil:
			conn.SetDeadline(deadline)
			fmt.Fprintln(conn, "detach")
			line, rerr := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if strings.HasPrefix(line, "error ") {
				return fmt.Errorf("detach %s: %s", st.ID, strings.TrimSpace(strings.TrimPrefix(line, "error ")))
			}
			if errors.Is(rerr, os.ErrDeadlineExceeded) {
				kind, parts := askPending(ctx, st.Control)
				return stillFlushing(st, *wait, kind, parts)
			}
			if !strings.HasPrefix(line, "detached") {
				return fmt.Errorf("detach %s: no answer from process %d: %v", st.ID, st.PID, rerr)
			}
		case processAlive(st.PID) && st.PID != os.Getpid():
			// The control socket is gone but the process runs: ask it to stop.
			if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
				return fmt.Errorf("detach %s: signal process %d: %w", st.ID, st.PID, err)
			}
		default:
			// What the dead attach left: its state, its control socket and
			// its NBD socket (attachSocket), as the next attach would.
			os.Remove(file)
			os.Remove(ctlPath)
			os.Remove(attachSocket(dir, pos[0]))
			return fmt.Errorf("lease %s was not attached any more (process %d is gone); removed its stale state", st.ID, st.PID)
		}
		// Wait until the attachment is gone: its state removed and, when it is
		// another process, that process exited.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			_, serr := os.Stat(file)
			gone := errors.Is(serr, os.ErrNotExist) && (st.PID == os.Getpid() || !processAlive(st.PID))
			if gone {
				break
			}
			if time.Now().After(deadline) {
				kind, parts := askPending(ctx, st.Control)
				return stillFlushing(st, *wait, kind, parts)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
		st.State = "detached"
		if output.structured() {
			return output.print(e.stdout, st)
		}
		fmt.Fprintf(e.stdout, "detached %s\n", st.ID)
		return nil
	}
}
