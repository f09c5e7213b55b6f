package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// slurmEnv is a prolog's or epilog's environment for job 9 of user 1000
// in script context ctx, with a comment.
func slurmEnv(ctx, comment string) func(string) string {
	m := map[string]string{"SLURM_CLUSTER_NAME": "c", "SLURM_JOB_ID": "9", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "1000",
		"SLURM_SCRIPT_CONTEXT": ctx, "SLURM_JOB_COMMENT": comment}
	return func(k string) string { return m[k] }
}

// deadAddr is an address nothing listens on: the control plane is down.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func writeEnvFile(t *testing.T, addr string, mode os.FileMode) string {
	p := filepath.Join(t.TempDir(), "slurm.env")
	if err := os.WriteFile(p, []byte("export RIALTO_ADDR="+addr+"\nexport RIALTO_TOKEN=rat_secret\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSlurmEpilogOutage: every job's end runs the node's Epilog, and a
// failing Epilog drains the node. The epilog asked the control plane for
// the leases of every job, also of jobs that asked for no devices, so
// while the control plane was down every node that finished any job was
// drained. The node's epilog only asks for jobs whose prolog left a job
// file on the node; EpilogSlurmctld, which runs also when the node died,
// always asks.
func TestSlurmEpilogOutage(t *testing.T) {
	envFile := writeEnvFile(t, deadAddr(t), 0o600)
	state := t.TempDir()
	args := []string{"slurm", "epilog", "--env-file", envFile, "--state-dir", state, "--timeout", "1s"}
	var out, errb bytes.Buffer
	if code := run(context.Background(), args, &env{stdout: &out, stderr: &errb, getenv: slurmEnv("epilog_slurmd", "")}); code != 0 {
		t.Errorf("the node's epilog of a job without devices, control plane down: exit %d: %s", code, errb.String())
	}
	// A job whose prolog made leases here: the epilog must reach the
	// control plane, and fails (keeping the job file for a retry) when
	// it cannot.
	jobFile := filepath.Join(state, "c-9.env")
	if err := os.WriteFile(jobFile, []byte("export RIALTO_LEASES=lease-x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := run(context.Background(), args, &env{stdout: &out, stderr: &errb, getenv: slurmEnv("epilog_slurmd", "")}); code != 1 {
		t.Errorf("the node's epilog of a job with leases, control plane down: exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(jobFile); err != nil {
		t.Errorf("the job file after a failed release: %v", err)
	}
	os.Remove(jobFile)
	errb.Reset()
	if code := run(context.Background(), args, &env{stdout: &out, stderr: &errb, getenv: slurmEnv("epilog_slurmctld", "")}); code != 1 {
		t.Errorf("EpilogSlurmctld, control plane down: exit %d: %s", code, errb.String())
	}
}

// TestSlurmEnvFileMode: the env file holds the token every job borrows
// with. One readable by others (a mode 0644 left by an installer) was
// used as it was: any user on the node could read the token. The prolog
// and epilog refuse it and say why.
func TestSlurmEnvFileMode(t *testing.T) {
	envFile := writeEnvFile(t, deadAddr(t), 0o644)
	state := t.TempDir()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"slurm", "prolog", "--env-file", envFile, "--state-dir", state, "--timeout", "5s"},
		&env{stdout: &out, stderr: &errb, getenv: slurmEnv("prolog_slurmd", "rialto: block 1GiB")})
	b, _ := os.ReadFile(filepath.Join(state, "c-9.env"))
	if code != 0 || !strings.Contains(string(b), "chmod 600") {
		t.Errorf("prolog with a mode 0644 env file: exit %d, job file %q, %s", code, b, errb.String())
	}
	errb.Reset()
	code = run(context.Background(), []string{"slurm", "epilog", "--env-file", envFile, "--state-dir", state, "--timeout", "5s"},
		&env{stdout: &out, stderr: &errb, getenv: slurmEnv("epilog_slurmctld", "")})
	if code != 1 || !strings.Contains(errb.String(), "chmod 600") {
		t.Errorf("epilog with a mode 0644 env file: exit %d, %s", code, errb.String())
	}
}

// TestSlurmEpilogSlurmctldLeavesTheJobFile: on a host that is both the
// controller and a node (one state directory for both), a job cancelled
// while its prolog runs has EpilogSlurmctld run alongside the prolog.
// EpilogSlurmctld listed the job's leases before the prolog made its
// lease and removed the job file after the prolog wrote it: the node's
// Epilog, finding no file, released nothing, and the lease outlived the
// job (TestRealSlurm's job cancelled in its prolog, under load). The job
// file is the node's: EpilogSlurmctld leaves it to the node's Epilog.
func TestSlurmEpilogSlurmctldLeavesTheJobFile(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// EpilogSlurmctld reaches the control plane through a proxy that
	// holds the answer to its listing until the prolog has finished.
	target, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	listed, resume := make(chan struct{}), make(chan struct{})
	rp.ModifyResponse = func(r *http.Response) error {
		if r.Request.Method == http.MethodGet && r.Request.URL.Path == "/v1/leases" {
			close(listed)
			select {
			case <-resume:
			case <-ctx.Done():
			}
		}
		return nil
	}
	proxy := httptest.NewServer(rp)
	defer proxy.Close()

	state := t.TempDir()
	envFile := func(addr string) string {
		p := filepath.Join(t.TempDir(), "slurm.env")
		if err := os.WriteFile(p, []byte("RIALTO_ADDR="+addr+"\nRIALTO_TOKEN="+testcluster.AdminToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	direct, slow := envFile(c.URL), envFile(proxy.URL)
	hook := func(verb, envFile, scriptCtx string) (int, string) {
		var out, errb bytes.Buffer
		code := run(ctx, []string{"slurm", verb, "--env-file", envFile, "--state-dir", state, "--timeout", "30s"},
			&env{stdout: &out, stderr: &errb, getenv: slurmEnv(scriptCtx, "rialto: block 4MiB")})
		return code, errb.String()
	}
	type result struct {
		code int
		err  string
	}
	ctld := make(chan result, 1)
	go func() { code, err := hook("epilog", slow, "epilog_slurmctld"); ctld <- result{code, err} }()
	select {
	case <-listed:
	case r := <-ctld:
		t.Fatalf("EpilogSlurmctld ended before it listed the leases: exit %d: %s", r.code, r.err)
	}
	if code, err := hook("prolog", direct, "prolog_slurmd"); code != 0 {
		t.Fatalf("prolog: exit %d: %s", code, err)
	}
	close(resume)
	if r := <-ctld; r.code != 0 {
		t.Fatalf("EpilogSlurmctld: exit %d: %s", r.code, r.err)
	}
	if code, err := hook("epilog", direct, "epilog_slurmd"); code != 0 {
		t.Fatalf("the node's epilog: exit %d: %s", code, err)
	}
	ls, err := c.Client().AllLeases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].State != api.LeaseReleased {
		var got []string
		for _, l := range ls {
			got = append(got, l.ID+" "+string(l.State))
		}
		t.Fatalf("the job's leases after both epilogs: %v; want one, released", got)
	}
	if _, err := os.Stat(filepath.Join(state, "c-9.env")); !os.IsNotExist(err) {
		t.Errorf("the job file after the node's epilog: %v", err)
	}
}
