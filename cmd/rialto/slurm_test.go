package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
