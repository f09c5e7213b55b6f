package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/filelock"
	"github.com/rialto-project/rialto/internal/resource"
	"github.com/rialto-project/rialto/internal/vm"
)

func init() {
	register(&command{Name: "vm run", Args: "--disk LEASE --kernel K",
		Summary: "Boot a qemu guest on this host whose virtio disk is a block lease (Ctrl-C or `rialto vm stop` stops it; --detach runs it in the background).", Flags: runVMRun})
	register(&command{Name: "vm stop", Args: "NAME", Summary: "Stop a VM cleanly (pause, flush its disk to the lender, quit) and wait until it is gone.", Flags: runVMStop, MinArgs: 1, MaxArgs: 1})
	register(&command{Name: "vm list", Summary: "List the VMs of the state dir.", Flags: runVMList})
	register(&command{Name: "vm move", Args: "NAME --to HOST",
		Summary: "Cold-migrate a VM: stop it cleanly and start it on another host with the same lent disk.", Flags: runVMMove, MinArgs: 1, MaxArgs: 1})
}

// readyFDEnv names the descriptor a detached `vm run` reports on: "ok
// RECORD-JSON" once the guest runs, or "error MESSAGE".
const readyFDEnv = "RIALTO_VM_READY_FD"

// vmStateDir is where VMs are recorded by default: $XDG_RUNTIME_DIR/rialto/vm,
// or ~/.rialto/vm without one.
func vmStateDir(e *env) string {
	if d := e.getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "rialto", "vm")
	}
	home := e.getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".rialto", "vm")
}

func stateDirFlag(fs *pflag.FlagSet, e *env) *string {
	return fs.String("state-dir", vmStateDir(e), "where VMs are recorded (their console logs, QMP sockets and disk sockets)")
}

// vmRunFlags are vm run's settings; vm move passes them on.
type vmRunFlags struct {
	disk, kernel, initrd, appendArgs, memory, accel, name, stateDir, logLevel string
	cpus                                                                      int
	detach                                                                    bool
}

// args is the command line of a `vm run` with these settings (no secret:
// the token travels in the environment).
func (f vmRunFlags) args(addr string) []string {
	a := []string{"vm", "run", "--disk", f.disk, "--kernel", f.kernel, "--memory", f.memory, "--cpus", strconv.Itoa(f.cpus),
		"--accel", f.accel, "--name", f.name, "--state-dir", f.stateDir, "--addr", addr, "--log-level", f.logLevel}
	if f.initrd != "" {
		a = append(a, "--initrd", f.initrd)
	}
	if f.appendArgs != "" {
		a = append(a, "--append", f.appendArgs)
	}
	if f.detach {
		a = append(a, "--detach")
	}
	return a
}

func runVMRun(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	var f vmRunFlags
	cf.register(fs, e)
	fs.StringVar(&f.disk, "disk", "", "the block `LEASE` that is the guest's virtio disk (attached here, its parts dialled as `rialto attach` dials them, and served to qemu on a Unix socket)")
	fs.StringVar(&f.kernel, "kernel", "", "the guest's kernel (qemu -kernel)")
	fs.StringVar(&f.initrd, "initrd", "", "the guest's initramfs (qemu -initrd)")
	fs.StringVar(&f.appendArgs, "append", "console=ttyS0", "the guest kernel's command line")
	f.memory = "256MiB"
	fs.Var(sizeText{&f.memory}, "memory", "the guest's memory")
	fs.IntVar(&f.cpus, "cpus", 1, "the guest's vCPUs")
	fs.StringVar(&f.accel, "accel", vm.AccelAuto, "tcg, kvm, or auto: KVM if a probe guest runs under it here within 5 s (the verdict is cached in the state dir), else TCG")
	fs.StringVar(&f.name, "name", "", "the VM's name (default: the lease's ID)")
	sd := stateDirFlag(fs, e)
	fs.BoolVar(&f.detach, "detach", false, "run in the background: return once the guest runs (its supervisor logs to STATE/NAME/supervisor.log)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	return func(ctx context.Context, _ []string) error {
		f.stateDir = *sd
		if f.disk == "" || f.kernel == "" {
			return usagef("--disk and --kernel are required")
		}
		if f.name == "" {
			f.name = f.disk
		}
		mem, err := resource.ParseSize(f.memory)
		if err != nil || mem < 16<<20 || mem%(1<<20) != 0 {
			return usagef("bad --memory %q: a whole number of MiB, at least 16MiB", f.memory)
		}
		for _, p := range []*string{&f.kernel, &f.initrd, &f.stateDir} {
			if *p != "" {
				if *p, err = filepath.Abs(*p); err != nil {
					return err
				}
			}
		}
		dir, err := vm.VMDir(f.stateDir, f.name)
		if err != nil {
			return err
		}
		if old, err := vm.LoadRecord(f.stateDir, f.name); err == nil && old.Running() {
			return fmt.Errorf("VM %s already runs on %s (process %d); `rialto vm stop %s` first", f.name, old.Host, old.PID, f.name)
		}
		if f.detach {
			return detachVMRun(ctx, e, &cf, f, dir)
		}
		ready := func(vm.Record) {}
		fail := func(error) {}
		if fd := e.getenv(readyFDEnv); fd != "" {
			n, err := strconv.Atoi(fd)
			if err != nil {
				return fmt.Errorf("bad %s", readyFDEnv)
			}
			w := os.NewFile(uintptr(n), "ready")
			var once sync.Once
			ready = func(r vm.Record) {
				once.Do(func() {
					b, _ := json.Marshal(r)
					fmt.Fprintf(w, "ok %s\n", b)
					w.Close()
				})
			}
			fail = func(err error) {
				once.Do(func() {
					fmt.Fprintf(w, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
					w.Close()
				})
			}
		}
		// The VM's lock, held until this supervisor exits: a second `vm
		// run` of the name (started at the same moment, before this one
		// has a record) is refused rather than boot the disk twice.
		lock, err := vm.Lock(f.stateDir, f.name)
		if err == nil {
			defer filelock.Close(lock)
			// The qemu of a supervisor killed a moment ago may still be
			// shutting down (its parent-death signal).
			if old, lerr := vm.LoadRecord(f.stateDir, f.name); lerr == nil && old.QEMURunning() {
				err = fmt.Errorf("VM %s: qemu %d of its previous supervisor still runs; `rialto vm stop %s` first", f.name, old.QEMUPID, f.name)
			}
		}
		if err == nil {
			err = superviseVM(ctx, e, &cf, f, mem>>20, dir, ready)
		}
		if err != nil {
			fail(err)
		}
		return err
	}
}

// superviseVM runs the VM in this process until ctx ends or the guest
// stops: it fetches the lease, attaches it on a Unix socket (its parts
// dialled here, as `rialto attach` dials them), runs qemu (vm.Run) on
// that socket, keeps the record, renews the lease and stops the guest
// when the lease ends.
func superviseVM(ctx context.Context, e *env, cf *clientFlags, f vmRunFlags, memMiB int64, dir string, ready func(vm.Record)) error {
	log, err := newLogger(e, f.logLevel)
	if err != nil {
		return err
	}
	// The CA certificates follow a CA rotation while the VM runs, as
	// attach's (watchLease asks the control plane at each check): the
	// supervisor verifies the control plane, and its disk's lenders,
	// with them.
	if err := cf.followRoots(); err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	l, err := activeLease(ctx, c, f.disk, api.KindBlock, "a VM's disk is a block lease")
	if err != nil {
		return err
	}
	uris, err := borrower.BlockURIs(l)
	if err != nil {
		return err
	}
	accel, why, err := vm.ResolveAccel(ctx, f.accel, "", f.stateDir)
	if err != nil {
		return err
	}
	if why != "" {
		log.Info("vm: running under TCG", "reason", why)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	dataTLS, err := cf.dataTLSFunc()
	if err != nil {
		return err
	}
	sock := filepath.Join(dir, "disk.sock")
	// A socket left by a killed supervisor is nobody's: this process
	// holds the VM's lock.
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("VM %s: stale disk socket: %w", f.name, err)
	}
	// Every lease, of one part or composed, is attached here: its parts
	// are dialled with the CA certificates and revocation list in use at
	// each dial (they follow a CA rotation: watchLease; a connection to a
	// lender a newer list revokes ends when the list is taken), and a part whose
	// lender restarted, or that moved, is redialled where the control
	// plane has it now. qemu only dials the local socket.
	att, err := borrower.Attach(ctx, c, l, borrower.AttachConfig{Listen: "unix:" + sock, TLS: dataTLS, Track: cf.dataTrack(log), Logger: log})
	if err != nil {
		return fmt.Errorf("attach %s: %w", l.ID, err)
	}
	defer att.Close()
	disk, err := nbd.ParseURI(att.URI())
	if err != nil {
		return err
	}
	diskDesc := "one part, attached here on " + sock
	if len(uris) > 1 {
		diskDesc = fmt.Sprintf("composed of %d parts, attached here on %s", len(uris), sock)
	}
	rec := vm.Record{Name: f.name, Host: vm.HostName(), PID: os.Getpid(), Lease: l.ID, Parts: len(uris), Disk: diskDesc,
		Kernel: f.kernel, Initrd: f.initrd, Append: f.appendArgs, MemoryMiB: memMiB, CPUs: f.cpus, Accel: accel, AccelWant: f.accel,
		Addr: cf.addr, QMP: filepath.Join(dir, vm.QMPSocket), Console: filepath.Join(dir, vm.ConsoleLog), CACertificates: cf.caFingerprints()}
	cfg := vm.Config{Name: f.name, Dir: dir, Kernel: f.kernel, Initrd: f.initrd, Append: f.appendArgs, MemoryMiB: memMiB,
		CPUs: f.cpus, Accel: accel, Disk: disk}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ended error // why the lease watcher stopped the guest
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	defer vm.RemoveRecord(f.stateDir, f.name)
	err = vm.Run(runCtx, cfg, log, func(r vm.Running) {
		rec.QEMUPID, rec.Started = r.PID, time.Now().UTC()
		if err := vm.SaveRecord(f.stateDir, rec); err != nil {
			log.Error("vm: record", "err", err)
		}
		// The watcher's copy of the record, which it saves again when
		// the CA certificates in use change.
		watched := rec
		wg.Add(1)
		go func() {
			defer wg.Done()
			follow := leaseFollow{ca: cf.caFollower(c, log), changed: func(fps []string) {
				watched.CACertificates = fps
				if err := vm.SaveRecord(f.stateDir, watched); err != nil {
					log.Warn("vm: recording the CA certificates in use", "err", err)
				}
			}}
			if err := watchLease(runCtx, c, l, log, follow); err != nil {
				ended = err
				cancel()
			}
		}()
		if e.getenv(readyFDEnv) == "" {
			if cf.json() {
				cf.print(e.stdout, rec)
			} else {
				fmt.Fprintf(e.stdout, "VM %s runs on %s under %s (qemu %d); disk: lease %s, %s; console: %s\n",
					rec.Name, rec.Host, rec.Accel, rec.QEMUPID, rec.Lease, rec.Disk, rec.Console)
				fmt.Fprintf(e.stderr, "rialto vm run: Ctrl-C or `rialto vm stop %s` stops it\n", rec.Name)
			}
		}
		ready(rec)
	})
	cancel()
	wg.Wait()
	if err != nil {
		return err
	}
	if ended != nil {
		return ended
	}
	return nil
}

// leaseFollow is what watchLease follows besides the lease: the CA
// certificates (ca, nil when they do not follow: no --cacert), changed
// being told their fingerprints when those in use changed.
type leaseFollow struct {
	ca      *caFollower
	changed func(fingerprints []string)
}

// watchLease renews the VM's disk lease before it expires and returns an
// error when the lease has ended (the disk is gone: the guest must stop).
// At each check it asks the control plane for its CA certificates and a
// newer revocation list too (follow.ca: a CA rotation, a removed node's
// certificates revoked), as attach does at each --watch.
func watchLease(ctx context.Context, c *api.Client, l api.Lease, log *slog.Logger, follow leaseFollow) error {
	ttl := time.Duration(l.TTLSeconds) * time.Second
	every := min(max(ttl/4, time.Second), time.Minute)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if follow.ca != nil && follow.ca.check(ctx) && follow.changed != nil {
			follow.changed(follow.ca.fingerprints())
		}
		cur, err := c.Lease(ctx, l.ID)
		switch {
		case api.IsCode(err, api.CodeNotFound):
			return fmt.Errorf("lease %s is gone; the VM was stopped", l.ID)
		case err != nil:
			log.Warn("vm: lease check failed", "lease", l.ID, "err", err)
			continue
		case cur.State.Terminal():
			return fmt.Errorf("lease %s is %s; the VM was stopped", l.ID, cur.State)
		}
		if ttl > 0 && time.Until(cur.ExpiresAt) < ttl/2 {
			if _, err := c.RenewLease(ctx, l.ID, 0); err != nil && ctx.Err() == nil {
				log.Warn("vm: lease renewal failed", "lease", l.ID, "err", err)
			}
		}
	}
}

// detachVMRun starts `vm run` again in the background (its own session,
// output to STATE/NAME/supervisor.log) and returns once it reports the
// guest running, or its error.
func detachVMRun(ctx context.Context, e *env, cf *clientFlags, f vmRunFlags, dir string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	logPath := filepath.Join(dir, "supervisor.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	if err := cf.resolveToken(); err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	child := f
	child.detach = false
	args := child.args(cf.addr)
	if cf.caCert != "" {
		if abs, err := filepath.Abs(cf.caCert); err == nil {
			args = append(args, "--cacert", abs)
		}
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), readyFDEnv+"=3", "RIALTO_TOKEN="+cf.token)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("start the VM's supervisor: %w", err)
	}
	// The supervisor outlives this process; reap it only if it fails now.
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- s
	}()
	var got string
	select {
	case got = <-line:
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM)
		return ctx.Err()
	}
	msg, ok := strings.CutPrefix(strings.TrimSpace(got), "ok ")
	if !ok {
		why, _ := strings.CutPrefix(strings.TrimSpace(got), "error ")
		<-exited
		if why == "" {
			why = "the supervisor exited; see " + logPath
		}
		return fmt.Errorf("vm %s: %s", f.name, why)
	}
	var rec vm.Record
	if err := json.Unmarshal([]byte(msg), &rec); err != nil {
		return fmt.Errorf("vm %s: bad report from its supervisor: %w", f.name, err)
	}
	if cf.json() {
		return cf.print(e.stdout, rec)
	}
	fmt.Fprintf(e.stdout, "VM %s runs on %s under %s (supervisor %d, qemu %d); disk: lease %s, %s; console: %s\n",
		rec.Name, rec.Host, rec.Accel, rec.PID, rec.QEMUPID, rec.Lease, rec.Disk, rec.Console)
	return nil
}

// stopVM stops a recorded VM cleanly and waits until it is gone: its
// supervisor (SIGTERM: it pauses the guest, flushes the disk and quits
// qemu, then removes the record), or qemu directly over QMP when the
// supervisor died.
func stopVM(ctx context.Context, stateDir string, rec vm.Record, within time.Duration) error {
	deadline := time.Now().Add(within)
	switch {
	case rec.Supervising() && rec.PID != os.Getpid():
		if err := syscall.Kill(rec.PID, syscall.SIGTERM); err != nil {
			return fmt.Errorf("stop %s: signal its supervisor %d: %w", rec.Name, rec.PID, err)
		}
	case rec.QEMURunning():
		sctx, cancel := context.WithDeadline(ctx, deadline)
		err := vm.StopQMP(sctx, rec.QMP)
		cancel()
		if err != nil {
			return fmt.Errorf("stop %s: its supervisor is gone and qemu %d does not stop over QMP: %w", rec.Name, rec.QEMUPID, err)
		}
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for rec.Running() {
		if time.Now().After(deadline) {
			return fmt.Errorf("stop %s: still running after %v", rec.Name, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return vm.RemoveRecord(stateDir, rec.Name)
}

func runVMStop(e *env, fs *pflag.FlagSet) runFunc {
	sd := stateDirFlag(fs, e)
	within := fs.Duration("timeout", 90*time.Second, "how long to wait for the VM to stop")
	output := outputVar(fs)
	return func(ctx context.Context, pos []string) error {
		rec, err := vm.LoadRecord(*sd, pos[0])
		if err != nil {
			return err
		}
		was := rec.Running()
		if err := stopVM(ctx, *sd, rec, *within); err != nil {
			return err
		}
		if output.structured() {
			return output.print(e.stdout, map[string]any{"name": rec.Name, "state": "stopped", "was_running": was})
		}
		if !was {
			fmt.Fprintf(e.stdout, "VM %s was not running (stale record removed)\n", rec.Name)
			return nil
		}
		fmt.Fprintf(e.stdout, "stopped %s\n", rec.Name)
		return nil
	}
}

// vmListed is a record as vm list shows it.
type vmListed struct {
	vm.Record
	State string `json:"state"` // running, or dead (a stale record)
}

func runVMList(e *env, fs *pflag.FlagSet) runFunc {
	sd := stateDirFlag(fs, e)
	output := outputVar(fs)
	return func(ctx context.Context, _ []string) error {
		recs, err := vm.ListRecords(*sd)
		if err != nil {
			return err
		}
		out := make([]vmListed, 0, len(recs))
		for _, r := range recs {
			st := "dead"
			if r.Running() {
				st = "running"
			}
			out = append(out, vmListed{Record: r, State: st})
		}
		if output.structured() {
			return output.print(e.stdout, out)
		}
		printVMs(e.stdout, out, time.Now())
		return nil
	}
}

func printVMs(w io.Writer, vms []vmListed, now time.Time) {
	tw := newTable(w)
	fmt.Fprintln(tw, "NAME\tSTATE\tHOST\tLEASE\tPARTS\tMEMORY\tACCEL\tPID\tSTARTED")
	for _, v := range vms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\n", v.Name, v.State, v.Host, v.Lease, v.Parts,
			resource.FormatSize(v.MemoryMiB<<20), v.Accel, v.PID, ago(now, v.Started))
	}
	tw.Flush()
}

// launcher is how `vm move` runs `rialto vm run` on the destination.
type launcher struct {
	name   string   // as given to --to
	prefix []string // the command that runs a command there
	bin    string   // the rialto binary there
}

// parseDest parses --to: netns:NAME (a network namespace of this machine,
// as the emulated rack's hosts are), local (this host's own namespace), or
// exec:COMMAND (a command that runs its arguments on the destination, such
// as "ssh -o SendEnv=RIALTO_TOKEN host2"; split on spaces, no shell).
func parseDest(to, remoteBin string) (launcher, error) {
	self, err := os.Executable()
	if err != nil {
		return launcher{}, err
	}
	switch {
	case strings.HasPrefix(to, "netns:"):
		ns := strings.TrimPrefix(to, "netns:")
		if ns == "" || strings.ContainsAny(ns, "/ ") {
			return launcher{}, fmt.Errorf("--to %q: bad namespace name", to)
		}
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err != nil {
			return launcher{}, fmt.Errorf("--to %q: no network namespace %s (ip netns list)", to, ns)
		}
		return launcher{name: to, prefix: []string{"ip", "netns", "exec", ns}, bin: self}, nil
	case to == "local":
		return launcher{name: vm.HostName(), bin: self}, nil
	case strings.HasPrefix(to, "exec:"):
		p := strings.Fields(strings.TrimPrefix(to, "exec:"))
		if len(p) == 0 {
			return launcher{}, fmt.Errorf("--to %q: no command", to)
		}
		return launcher{name: to, prefix: p, bin: remoteBin}, nil
	}
	return launcher{}, fmt.Errorf("--to %q: want netns:NAME, local or exec:COMMAND", to)
}

// hostLauncher is the launcher of where a record says its VM ran.
func hostLauncher(host string) (launcher, error) {
	if strings.HasPrefix(host, "netns:") {
		return parseDest(host, "")
	}
	return parseDest("local", "")
}

func (l launcher) command(ctx context.Context, args ...string) *exec.Cmd {
	full := append(append(append([]string(nil), l.prefix...), l.bin), args...)
	return exec.CommandContext(ctx, full[0], full[1:]...)
}

// launch runs `rialto vm run --detach` there and returns the record the
// new supervisor reports.
func (l launcher) launch(ctx context.Context, token string, f vmRunFlags, addr string) (vm.Record, error) {
	f.detach = true
	cmd := l.command(ctx, append(f.args(addr), "-o", "json")...)
	cmd.Env = append(os.Environ(), "RIALTO_TOKEN="+token)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return vm.Record{}, fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var rec vm.Record
	if err := json.Unmarshal(out, &rec); err != nil {
		return vm.Record{}, fmt.Errorf("unexpected output %q", strings.TrimSpace(string(out)))
	}
	return rec, nil
}

// vmMoveOut is vm move's JSON output.
type vmMoveOut struct {
	Name     string    `json:"name"`
	From     string    `json:"from"`
	To       string    `json:"to"`
	Stopped  float64   `json:"stop_seconds"`
	Started  float64   `json:"start_seconds"`
	VM       vm.Record `json:"vm"`
	Restored bool      `json:"restored_at_source,omitempty"`
}

func runVMMove(e *env, fs *pflag.FlagSet) runFunc {
	var cf clientFlags
	cf.register(fs, e)
	sd := stateDirFlag(fs, e)
	to := fs.String("to", "", "the `destination`: netns:NAME (a network namespace here, e.g. an emulated rack's host), local, or exec:COMMAND (runs rialto vm run there, e.g. exec:ssh host2)")
	remoteBin := fs.String("remote-rialto", "rialto", "with --to exec:, the rialto binary on the destination")
	within := fs.Duration("timeout", 90*time.Second, "how long to wait for the VM to stop")
	return func(ctx context.Context, pos []string) error {
		if *to == "" {
			return usagef("--to is required")
		}
		if err := cf.resolveToken(); err != nil {
			return err
		}
		rec, err := vm.LoadRecord(*sd, pos[0])
		if err != nil {
			return err
		}
		if !rec.Supervising() {
			return fmt.Errorf("VM %s is not running (its supervisor %d is gone); start it with `rialto vm run`", rec.Name, rec.PID)
		}
		dst, err := parseDest(*to, *remoteBin)
		if err != nil {
			return err
		}
		if dst.name == rec.Host {
			return fmt.Errorf("VM %s already runs on %s", rec.Name, rec.Host)
		}
		// Check that the destination can run rialto before stopping anything.
		vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := dst.command(vctx, "version").CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("--to %s cannot run %s: %v: %s", *to, dst.bin, err, strings.TrimSpace(string(out)))
		}
		addr := rec.Addr
		if addr == "" {
			addr = cf.addr
		}
		f := vmRunFlags{disk: rec.Lease, kernel: rec.Kernel, initrd: rec.Initrd, appendArgs: rec.Append,
			memory: strconv.FormatInt(rec.MemoryMiB, 10) + "MiB", cpus: rec.CPUs, accel: rec.AccelWant, name: rec.Name,
			stateDir: *sd, logLevel: "info"}
		if f.accel == "" {
			f.accel = vm.AccelAuto
		}
		if f.cpus == 0 {
			f.cpus = 1
		}
		res := vmMoveOut{Name: rec.Name, From: rec.Host, To: dst.name}
		t0 := time.Now()
		if err := stopVM(ctx, *sd, rec, *within); err != nil {
			return fmt.Errorf("move %s: %w", rec.Name, err)
		}
		res.Stopped = time.Since(t0).Seconds()
		t1 := time.Now()
		moved, err := dst.launch(ctx, cf.token, f, addr)
		if err != nil {
			// Bring it back where it was rather than leave it stopped.
			src, serr := hostLauncher(rec.Host)
			if serr == nil {
				_, serr = src.launch(ctx, cf.token, f, addr)
			}
			if serr != nil {
				return fmt.Errorf("move %s: start on %s: %v; and restarting it on %s failed too: %v (its disk, lease %s, is intact)",
					rec.Name, dst.name, err, rec.Host, serr, rec.Lease)
			}
			return fmt.Errorf("move %s: start on %s: %v; it runs on %s again", rec.Name, dst.name, err, rec.Host)
		}
		res.Started = time.Since(t1).Seconds()
		res.VM, res.To = moved, moved.Host
		if cf.json() {
			return cf.print(e.stdout, res)
		}
		fmt.Fprintf(e.stdout, "moved %s from %s to %s: stopped and flushed in %.1f s, running again in %.1f s (qemu %d, disk: lease %s)\n",
			res.Name, res.From, res.To, res.Stopped, res.Started, moved.QEMUPID, moved.Lease)
		return nil
	}
}
