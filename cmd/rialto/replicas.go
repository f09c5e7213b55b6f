package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/childenv"
	"github.com/rialto-project/rialto/internal/pgserver"
)

// replicaSet is the control plane of `rialto up --replicas N`: a
// throwaway PostgreSQL server in the state dir (dir/pg) and N `rialto
// server` processes sharing it, each on its own port. Each replica's log
// is dir/replicaN.log. Killing one (kill -9) shows the failover: clients
// and agents given the list of addresses move to the next, and another
// replica takes over the background duties within seconds
// (docs/operations.md, "Replicas").
type replicaSet struct {
	pg     *pgserver.Server
	reaper *replicaReaper
	urls   []string
	procs  []*exec.Cmd
	done   []chan struct{}
}

func (r *replicaSet) url() string { return strings.Join(r.urls, ",") }

// startSweeping does nothing: each replica runs its own election and the
// elected one sweeps.
func (r *replicaSet) startSweeping(context.Context) {}

// startReplicas starts PostgreSQL and n replicas, and waits until each
// answers /healthz. lock is the state dir's lock, which the reaper holds
// while it cleans up after this process.
//
// Nothing outlives this process: the replicas get SIGTERM when it dies
// (their parent-death signal), and a reaper process (this binary with the
// hidden argument up-replicas-reaper) stops PostgreSQL if this process
// dies without stopping it (kill -9, a crash).
func startReplicas(ctx context.Context, dir string, n int, st upState, caFile string, args []string, lock *os.File) (*replicaSet, error) {
	if _, err := pgserver.FindBin(); err != nil {
		return nil, fmt.Errorf("rialto up --replicas needs PostgreSQL for the replicas' shared store: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	pgDir := filepath.Join(dir, "pg")
	// The reaper first: this process may die while PostgreSQL starts.
	rp, err := startReplicaReaper(exe, pgDir, lock)
	if err != nil {
		return nil, err
	}
	r := &replicaSet{reaper: rp}
	pg, err := pgserver.Start(ctx, pgDir, pgserver.Options{})
	if err != nil {
		// What Start left running, the reaper stops.
		return nil, errors.Join(fmt.Errorf("start PostgreSQL: %w", err), rp.dismiss(false))
	}
	r.pg = pg
	if err := pg.CreateDatabase(ctx, "rialto"); err != nil {
		r.stop()
		return nil, err
	}
	hc, err := api.HTTPClient(caFile, 5*time.Second)
	if err != nil {
		r.stop()
		return nil, err
	}
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			r.stop()
			return nil, err
		}
		addr := ln.Addr().String()
		ln.Close()
		logf, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("replica%d.log", i+1)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			r.stop()
			return nil, err
		}
		cmd := exec.Command(exe, append([]string{"server", "--listen", addr}, args...)...)
		// Secrets go through the environment, not the command line (ps).
		cmd.Env = append(os.Environ(), "RIALTO_DB="+pg.URL("rialto"), "RIALTO_BOOTSTRAP_TOKEN="+st.BootstrapToken,
			"RIALTO_ADMIN_TOKEN="+st.AdminToken, "RIALTO_TOKENS="+st.MetricsToken+":prometheus")
		cmd.Stdout, cmd.Stderr = logf, logf
		// A replica ends with this process, however it ends.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		done := make(chan struct{})
		started := make(chan error, 1)
		go func() { // owned by stop, which waits on done
			// The parent-death signal fires when the thread that started
			// the child ends: this goroutine keeps its thread until the
			// replica has exited (the thread ends with it, never unlocked).
			runtime.LockOSThread()
			defer close(done)
			defer logf.Close()
			if err := cmd.Start(); err != nil {
				started <- err
				return
			}
			started <- nil
			cmd.Wait()
		}()
		if err := <-started; err != nil {
			<-done
			r.stop()
			return nil, fmt.Errorf("start replica %d: %w", i+1, err)
		}
		r.procs, r.done = append(r.procs, cmd), append(r.done, done)
		u := "https://" + addr
		r.urls = append(r.urls, u)
		// One at a time: a replica issues its certificate from the shared
		// CA as it starts.
		if err := waitReplica(ctx, hc, u, done, filepath.Join(dir, fmt.Sprintf("replica%d.log", i+1))); err != nil {
			r.stop()
			return nil, fmt.Errorf("replica %d: %w", i+1, err)
		}
	}
	return r, nil
}

// waitReplica polls the replica's /healthz until it answers 200.
func waitReplica(ctx context.Context, hc *http.Client, url string, done chan struct{}, log string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("exited; see %s", log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("did not answer within 30s; see %s", log)
		}
	}
}

// stop stops the replicas (SIGTERM, then SIGKILL after 10 s) and
// PostgreSQL, and dismisses the reaper.
func (r *replicaSet) stop() error {
	for _, p := range r.procs {
		p.Process.Signal(syscall.SIGTERM)
	}
	for i, p := range r.procs {
		select {
		case <-r.done[i]:
		case <-time.After(10 * time.Second):
			p.Process.Kill()
			<-r.done[i]
		}
	}
	var err error
	if r.pg != nil {
		err = r.pg.Close()
	}
	if r.reaper != nil {
		// Without "done" when PostgreSQL did not stop: the reaper tries again.
		err = errors.Join(err, r.reaper.dismiss(err == nil))
	}
	return err
}

// replicaReaperArg is the hidden first argument that makes the rialto
// binary the reaper of a `rialto up --replicas`: rialto
// up-replicas-reaper PGDIR.
const replicaReaperArg = "up-replicas-reaper"

// runReplicaReaperIfChild makes this process the reaper of a `rialto up
// --replicas` and exits if it was started as one; otherwise it returns at
// once. The reaper reads its standard input, a pipe from `rialto up`:
// "done" dismisses it; when the pipe closes without it (rialto up died),
// it stops the PostgreSQL server of PGDIR. It ignores SIGINT, SIGTERM and
// SIGHUP (a terminal's Ctrl-C is rialto up's to handle), and holds the
// state dir's lock, inherited as file descriptor 3, until it exits: a
// `rialto up` started meanwhile waits for it (lockStateDir).
func runReplicaReaperIfChild() {
	if len(os.Args) != 3 || os.Args[1] != replicaReaperArg {
		return
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "up-replicas-reaper")
	os.Exit(reapReplicas(os.Stdin, os.Args[2], os.NewFile(3, "lock"), log))
}

func reapReplicas(in io.Reader, pgDir string, lock *os.File, log *slog.Logger) int {
	b, _ := io.ReadAll(in)
	if strings.TrimSpace(string(b)) == "done" {
		return 0
	}
	if lock != nil {
		// Whoever finds the state dir locked now learns it is this reaper's.
		_ = lock.Truncate(0)
		_, _ = lock.WriteAt([]byte(fmt.Sprintf("%s %d\n", replicaReaperArg, os.Getpid())), 0)
	}
	if _, err := os.Stat(filepath.Join(pgDir, "port")); err != nil {
		return 0 // rialto up died before PostgreSQL was started
	}
	pg, err := pgserver.Attach(pgDir)
	if err != nil {
		log.Error("attach", "err", err)
		return 1
	}
	if _, err := os.Stat(filepath.Join(pg.DataDir(), "postmaster.pid")); errors.Is(err, os.ErrNotExist) {
		return 0 // stopped already (rialto up died after stopping it)
	}
	log.Warn("rialto up is gone without stopping its PostgreSQL: stopping it", "dir", pgDir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pg.Stop(ctx, "fast"); err != nil {
		log.Error("stop", "err", err)
		return 1
	}
	log.Info("stopped PostgreSQL", "dir", pgDir)
	return 0
}

// replicaReaper is rialto up's side of its reaper process.
type replicaReaper struct {
	cmd  *exec.Cmd
	in   *os.File // write end of the reaper's stdin; only this process has it
	done chan struct{}
}

func startReplicaReaper(exe, pgDir string, lock *os.File) (*replicaReaper, error) {
	pr, pw, err := os.Pipe() // close-on-exec: no other child inherits pw
	if err != nil {
		return nil, fmt.Errorf("up: reaper pipe: %w", err)
	}
	defer pr.Close()
	logf, err := os.OpenFile(filepath.Join(filepath.Dir(pgDir), "reaper.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		pw.Close()
		return nil, fmt.Errorf("up: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(exe, replicaReaperArg, pgDir)
	cmd.Stdin, cmd.Stderr = pr, logf
	cmd.ExtraFiles = []*os.File{lock}
	cmd.Env = childenv.Environ()
	// Its own process group: a terminal's Ctrl-C does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("up: start the reaper: %w", err)
	}
	rp := &replicaReaper{cmd: cmd, in: pw, done: make(chan struct{})}
	go func() { // owned by dismiss, which waits on done
		defer close(rp.done)
		_ = cmd.Wait()
	}()
	return rp, nil
}

// dismiss ends the reaper: with done, it leaves; without, it stops
// PostgreSQL first. It waits for the reaper to exit.
func (rp *replicaReaper) dismiss(done bool) error {
	if done {
		_, _ = io.WriteString(rp.in, "done\n")
	}
	rp.in.Close()
	select {
	case <-rp.done:
		return nil
	case <-time.After(3 * time.Minute):
		_ = rp.cmd.Process.Kill()
		<-rp.done
		return errors.New("up: the reaper did not exit; killed")
	}
}

// replicaArgs are the `rialto server` flags of a replica of `rialto up`.
func replicaArgs(tm timings, quotas []string, level, tlsDir string) []string {
	args := []string{"--tls-dir", tlsDir, "--heartbeat", tm.heartbeat.String(), "--suspect-after", tm.suspect.String(), "--down-after", tm.down.String(),
		"--prepare-timeout", tm.prepare.String(), "--default-ttl", tm.ttl.String(), "--log-level", level,
		"--max-heartbeats-per-second", strconv.FormatFloat(tm.maxBeats, 'g', -1, 64)}
	for _, q := range quotas {
		args = append(args, "--quota", q)
	}
	return args
}
