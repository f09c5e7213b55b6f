package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/slurm"
)

func init() {
	register(&command{Name: "slurm prolog", Summary: "Slurm Prolog: lease the devices the job's comment asks for ('rialto: block 100GiB composed 3').", Flags: runSlurmProlog})
	register(&command{Name: "slurm task-prolog", Summary: "Slurm TaskProlog: put the job's lease IDs and URIs in its environment, or fail it with the reason.", Flags: runSlurmTaskProlog})
	register(&command{Name: "slurm epilog", Summary: "Slurm Epilog and EpilogSlurmctld: release the job's leases, however it ended.", Flags: runSlurmEpilog})
}

const (
	defaultSlurmEnvFile  = "/etc/rialto/slurm.env"
	defaultSlurmStateDir = "/run/rialto-slurm"
)

// slurmFlags are the flags of the slurm verbs.
type slurmFlags struct {
	envFile, stateDir string
	timeout           time.Duration
	caCert            string // the cluster CA's certificate, from the env file (slurmClient)
}

func (sf *slurmFlags) register(fs *pflag.FlagSet, client bool) {
	if client {
		fs.StringVar(&sf.envFile, "env-file", defaultSlurmEnvFile, "`file` with RIALTO_ADDR=, RIALTO_CACERT= and RIALTO_TOKEN= lines (the format of rialto up's STATE/env; keep it root's only)")
		fs.DurationVar(&sf.timeout, "timeout", time.Minute, "give up on the control plane after this long")
	}
	fs.StringVar(&sf.stateDir, "state-dir", defaultSlurmStateDir, "where the prolog leaves each job's lease environment for the task prolog")
}

// slurmClient builds a client from the env file; RIALTO_ADDR, RIALTO_CACERT
// and RIALTO_TOKEN in the environment win (Slurm runs prologs with a bare
// environment, so the file is the usual way).
func (sf *slurmFlags) slurmClient(e *env) (*api.Client, error) {
	vals := map[string]string{}
	if f, err := os.Open(sf.envFile); err == nil {
		defer f.Close()
		// It holds the token every job borrows with.
		st, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("env file: %w", err)
		}
		if st.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("env file %s holds the cluster's token and others may read it (mode %04o): chmod 600 it (root's on the nodes, SlurmUser's on the controller)", sf.envFile, st.Mode().Perm())
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export "))
			if k, v, ok := strings.Cut(line, "="); ok {
				vals[k] = strings.Trim(v, `"'`)
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) || sf.envFile != defaultSlurmEnvFile {
		return nil, fmt.Errorf("env file: %w", err)
	}
	for _, k := range []string{"RIALTO_ADDR", "RIALTO_CACERT", "RIALTO_TOKEN"} {
		if v := e.getenv(k); v != "" {
			vals[k] = v
		}
	}
	if vals["RIALTO_ADDR"] == "" || vals["RIALTO_TOKEN"] == "" {
		return nil, fmt.Errorf("no RIALTO_ADDR and RIALTO_TOKEN (in %s or the environment)", sf.envFile)
	}
	cf := clientFlags{addr: vals["RIALTO_ADDR"], caCert: vals["RIALTO_CACERT"], token: vals["RIALTO_TOKEN"], out: &output{}}
	sf.caCert = cf.caCert
	return cf.client()
}

// runSlurmProlog leases the job's devices. It exits 0 when they cannot be
// placed (a failing Prolog would drain the node): the task prolog fails
// the job with the reason instead.
func runSlurmProlog(e *env, fs *pflag.FlagSet) runFunc {
	var sf slurmFlags
	sf.register(fs, true)
	return func(ctx context.Context, _ []string) error {
		j, err := slurm.JobFromEnv(e.getenv)
		if err != nil {
			return err
		}
		reqs, perr := slurm.ParseComment(j.Comment)
		if perr == nil && len(reqs) == 0 {
			// The job asks for no devices. A file of an earlier job of
			// the same ID (Slurm reuses IDs) must not reach this one.
			if err := os.Remove(j.File(sf.stateDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		}
		// Before any lease: the job file is how the node's epilog knows
		// there is something to release, and how the task prolog fails
		// the job should this prolog not finish. A prolog run again keeps
		// the file it finds (its steps may be starting) until it rewrites it.
		if err := slurm.CheckStateDir(sf.stateDir); err != nil {
			return err
		}
		if _, err := os.Lstat(j.File(sf.stateDir)); errors.Is(err, os.ErrNotExist) {
			if err := slurm.WriteFile(sf.stateDir, j, nil, errors.New("the prolog did not finish")); err != nil {
				return err
			}
		}
		var lines []string
		failure := perr
		if failure == nil {
			var c *api.Client
			if c, err = sf.slurmClient(e); err != nil {
				failure = err
			} else {
				ctx, cancel := context.WithTimeout(ctx, sf.timeout)
				defer cancel()
				ls, err := slurm.Ensure(ctx, c, j, reqs)
				if err != nil {
					failure = err
				} else {
					lines = slurm.Env(ls, sf.caCert)
					ids := make([]string, len(ls))
					for i, l := range ls {
						ids[i] = l.ID
					}
					fmt.Fprintf(e.stderr, "rialto slurm prolog: job %s: leases %s\n", j.ID, strings.Join(ids, " "))
				}
			}
		}
		if failure != nil {
			fmt.Fprintf(e.stderr, "rialto slurm prolog: job %s: %v\n", j.ID, failure)
		}
		return slurm.WriteFile(sf.stateDir, j, lines, failure)
	}
}

// runSlurmTaskProlog prints the job's environment lines (Slurm's
// TaskProlog protocol), or a print line with the failure and exits 1,
// which fails the job with that line in its output.
func runSlurmTaskProlog(e *env, fs *pflag.FlagSet) runFunc {
	var sf slurmFlags
	sf.register(fs, false)
	return func(ctx context.Context, _ []string) error {
		j, err := slurm.JobFromEnv(e.getenv)
		if err != nil {
			return err
		}
		lines, failed, err := slurm.TaskPrologLines(sf.stateDir, j)
		if err != nil {
			return err
		}
		for _, l := range lines {
			fmt.Fprintln(e.stdout, l)
		}
		if failed {
			return errors.New("the job's devices could not be leased")
		}
		return nil
	}
}

// runSlurmEpilog releases the job's leases and removes its file. On a
// node (Epilog) it asks the control plane only when the prolog left a job
// file there: every job's end runs it, and a failing Epilog drains the
// node, so a control plane that is down must not drain nodes that ran
// jobs without devices. EpilogSlurmctld (which runs also when the job's
// node died) always asks, and leaves the job file to the node's Epilog.
func runSlurmEpilog(e *env, fs *pflag.FlagSet) runFunc {
	var sf slurmFlags
	sf.register(fs, true)
	return func(ctx context.Context, _ []string) error {
		j, err := slurm.JobFromEnv(e.getenv)
		if err != nil {
			return err
		}
		file := j.File(sf.stateDir)
		scriptCtx := e.getenv("SLURM_SCRIPT_CONTEXT")
		if scriptCtx == "epilog_slurmd" {
			if _, err := os.Lstat(file); errors.Is(err, os.ErrNotExist) {
				return nil
			}
		}
		c, err := sf.slurmClient(e)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, sf.timeout)
		defer cancel()
		ids, err := slurm.Release(ctx, c, j)
		if len(ids) > 0 {
			fmt.Fprintf(e.stderr, "rialto slurm epilog: job %s: released %s\n", j.ID, strings.Join(ids, " "))
		}
		if err != nil {
			return err // the file stays: an epilog run again tries again
		}
		if scriptCtx == "epilog_slurmctld" {
			// The job file is the node's. On a host that is both the
			// controller and a node, a job cancelled while its prolog
			// runs has this epilog run alongside the prolog: removing
			// the file the prolog wrote after listing the leases it
			// had not made yet would leave the node's Epilog nothing
			// to release them by.
			return nil
		}
		if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
}
