package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/api"
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
	pg    *pgserver.Server
	urls  []string
	procs []*exec.Cmd
	done  []chan struct{}
}

func (r *replicaSet) url() string { return strings.Join(r.urls, ",") }

// startSweeping does nothing: each replica runs its own election and the
// elected one sweeps.
func (r *replicaSet) startSweeping(context.Context) {}

// startReplicas starts PostgreSQL and n replicas, and waits until each
// answers /healthz.
func startReplicas(ctx context.Context, dir string, n int, st upState, caFile string, args []string) (*replicaSet, error) {
	pg, err := pgserver.Start(ctx, filepath.Join(dir, "pg"), pgserver.Options{})
	if errors.Is(err, pgserver.ErrNotInstalled) {
		return nil, fmt.Errorf("rialto up --replicas needs PostgreSQL for the replicas' shared store: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	r := &replicaSet{pg: pg}
	if err := pg.CreateDatabase(ctx, "rialto"); err != nil {
		r.stop()
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
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
		if err := cmd.Start(); err != nil {
			logf.Close()
			r.stop()
			return nil, fmt.Errorf("start replica %d: %w", i+1, err)
		}
		done := make(chan struct{})
		go func() { // owned by stop, which waits on done
			cmd.Wait()
			logf.Close()
			close(done)
		}()
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
// PostgreSQL.
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
	if r.pg == nil {
		return nil
	}
	return r.pg.Close()
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
