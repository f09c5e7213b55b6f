package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/resource"
)

// Prefix starts a job comment that asks Rialto for devices.
const Prefix = "rialto:"

// MaxLeases bounds the leases one job may ask for.
const MaxLeases = 8

// ParseComment reads the lease requests of a job comment:
//
//	rialto: REQUEST [; REQUEST]...
//	REQUEST = KIND [SIZE] [dedicated|shared|composed|whole] [COUNT] [ttl=DURATION] [stripe=SIZE] [role=NAME] [strategy=binpack|spread] [bandwidth=SIZE]
//
// KIND is block, memory or accel; SIZE is a size such as 100GiB (block,
// memory); COUNT the number of parts (composed) or slots (accel). A
// comment without the prefix asks for nothing (nil, nil).
func ParseComment(comment string) ([]api.LeaseRequest, error) {
	c := strings.TrimSpace(comment)
	if !strings.HasPrefix(strings.ToLower(c), Prefix) {
		return nil, nil
	}
	c = strings.TrimSpace(c[len(Prefix):])
	var out []api.LeaseRequest
	for i, part := range strings.Split(c, ";") {
		f := strings.Fields(part)
		if len(f) == 0 {
			continue
		}
		r, err := parseRequest(f)
		if err != nil {
			return nil, fmt.Errorf("slurm: request %d %q: %w", i+1, strings.TrimSpace(part), err)
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, errors.New("slurm: the comment says rialto: but asks for nothing (e.g. 'rialto: block 100GiB composed 3')")
	}
	if len(out) > MaxLeases {
		return nil, fmt.Errorf("slurm: %d requests; at most %d per job", len(out), MaxLeases)
	}
	return out, nil
}

var countRe = regexp.MustCompile(`^[0-9]+$`)

func parseRequest(f []string) (api.LeaseRequest, error) {
	var r api.LeaseRequest
	switch k := api.Kind(strings.ToLower(f[0])); k {
	case api.KindBlock, api.KindMemory, api.KindAccel:
		r.Kind = k
	default:
		return r, fmt.Errorf("unknown kind %q (block, memory or accel)", f[0])
	}
	for _, w := range f[1:] {
		lw := strings.ToLower(w)
		switch {
		case lw == "dedicated" || lw == "shared" || lw == "composed":
			r.Mode = api.Mode(lw)
		case lw == "whole":
			r.Whole = true
		case countRe.MatchString(w):
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 || n > 64 {
				return r, fmt.Errorf("count %q must be between 1 and 64", w)
			}
			r.Count = n
		case strings.Contains(w, "="):
			k, v, _ := strings.Cut(w, "=")
			switch strings.ToLower(k) {
			case "ttl":
				d, err := time.ParseDuration(v)
				if err != nil || d < time.Second {
					return r, fmt.Errorf("ttl %q is not a duration of a second or more (e.g. 2h)", v)
				}
				r.TTLSeconds = int64(d / time.Second)
			case "stripe":
				n, err := resource.ParseSize(v)
				if err != nil {
					return r, fmt.Errorf("stripe: %w", err)
				}
				r.StripeUnit = n
			case "role":
				r.Role = v
			case "strategy":
				r.Strategy = v
			case "bandwidth":
				n, err := resource.ParseSize(v)
				if err != nil {
					return r, fmt.Errorf("bandwidth: %w", err)
				}
				r.Bandwidth = float64(n)
			default:
				return r, fmt.Errorf("unknown option %q (ttl, stripe, role, strategy, bandwidth)", k)
			}
		default:
			n, err := resource.ParseSize(w)
			if err != nil {
				return r, fmt.Errorf("%q is not a size, mode, count or option", w)
			}
			r.Size = n
		}
	}
	if r.Kind == api.KindAccel && r.Count == 0 {
		r.Count = 1
	}
	if r.Kind != api.KindAccel && r.Size == 0 && !r.Whole {
		return r, errors.New("a size is required (e.g. 100GiB), or whole")
	}
	return r, nil
}

// Job names a Slurm job as the glue sees it (from the prolog and epilog
// environment).
type Job struct {
	Cluster  string // SLURM_CLUSTER_NAME
	ID       string // SLURM_JOB_ID
	Restarts int    // SLURM_JOB_RESTART_COUNT
	Comment  string // SLURM_JOB_COMMENT
	UID, GID int    // SLURM_JOB_UID, SLURM_JOB_GID (-1: unknown)
}

var safeRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// JobFromEnv reads a Job from Slurm's prolog/epilog environment.
func JobFromEnv(getenv func(string) string) (Job, error) {
	j := Job{Cluster: getenv("SLURM_CLUSTER_NAME"), ID: getenv("SLURM_JOB_ID"), Comment: getenv("SLURM_JOB_COMMENT"), UID: -1, GID: -1}
	if j.Cluster == "" {
		j.Cluster = "slurm"
	}
	if !safeRe.MatchString(j.ID) || !safeRe.MatchString(j.Cluster) {
		return j, fmt.Errorf("slurm: SLURM_JOB_ID %q or SLURM_CLUSTER_NAME %q missing or malformed (run from a Slurm prolog or epilog)", j.ID, j.Cluster)
	}
	if v := getenv("SLURM_JOB_RESTART_COUNT"); v != "" {
		j.Restarts, _ = strconv.Atoi(v)
	}
	if v, err := strconv.Atoi(getenv("SLURM_JOB_UID")); err == nil {
		j.UID = v
	}
	if v, err := strconv.Atoi(getenv("SLURM_JOB_GID")); err == nil {
		j.GID = v
	}
	return j, nil
}

// keyPrefix starts the idempotency keys of every lease of the job, in
// every run of it.
func (j Job) keyPrefix() string { return "slurm-" + j.Cluster + "-" + j.ID + "-" }

// Key is the idempotency key of request i of this run of the job.
func (j Job) Key(i int) string { return fmt.Sprintf("%s%d-%d", j.keyPrefix(), j.Restarts, i) }

// runKeyRe is what follows the job's prefix in the key of one of its
// leases (Key): the run's restart count and the request's index.
var runKeyRe = regexp.MustCompile(`^[0-9]+-[0-9]+$`)

// owns reports whether key is the idempotency key of a lease of the job,
// in any run of it: its prefix followed by a run's restart count and a
// request's index, and nothing else. The prefix alone is not enough:
// cluster names and job IDs may hold dashes, so job 2 of cluster "hpc-1"
// (slurm-hpc-1-2-0-0) starts with job 1 of cluster "hpc"'s prefix.
func (j Job) owns(key string) bool {
	rest, ok := strings.CutPrefix(key, j.keyPrefix())
	return ok && runKeyRe.MatchString(rest)
}

// File is the job's file in the state directory.
func (j Job) File(stateDir string) string {
	return filepath.Join(stateDir, j.Cluster+"-"+j.ID+".env")
}

// Ensure creates (or, on a retry, finds again) the leases the job's
// comment asks for. When one cannot be placed, those already made for
// this run are released and the error carries the control plane's reason.
func Ensure(ctx context.Context, c *api.Client, j Job, reqs []api.LeaseRequest) ([]api.Lease, error) {
	var out []api.Lease
	for i, r := range reqs {
		r.IdempotencyKey = j.Key(i)
		r.Borrower = "slurm job " + j.ID + " (" + j.Cluster + ")"
		// The job is in the key and the borrower: a request's labels are
		// node selectors in Rialto, not tags of the lease.
		l, err := c.CreateLease(ctx, r)
		if err == nil && l.State.Terminal() {
			err = fmt.Errorf("lease %s of this job is already %s (%s)", l.ID, l.State, l.Reason)
		}
		if err != nil {
			for _, m := range out {
				c.ReleaseLease(context.WithoutCancel(ctx), m.ID)
			}
			var ae *api.Error
			if errors.As(err, &ae) {
				return nil, fmt.Errorf("lease %d (%s) could not be placed: %s (%s)", i+1, describe(r), ae.Message, ae.Code)
			}
			return nil, fmt.Errorf("lease %d (%s): %w", i+1, describe(r), err)
		}
		out = append(out, l)
	}
	return out, nil
}

func describe(r api.LeaseRequest) string {
	s := string(r.Kind)
	if r.Size > 0 {
		s += " " + resource.FormatSize(r.Size)
	}
	if r.Mode != "" {
		s += " " + string(r.Mode)
	}
	if r.Count > 1 {
		s += " " + strconv.Itoa(r.Count)
	}
	return s
}

// Release releases every live lease of the job (every run of it: the
// leases whose idempotency key is one of its Keys); it returns the IDs
// released.
func Release(ctx context.Context, c *api.Client, j Job) ([]string, error) {
	ls, err := c.Leases(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	var errs []error
	for _, l := range ls {
		if !j.owns(l.IdempotencyKey) {
			continue
		}
		if _, err := c.ReleaseLease(ctx, l.ID); err != nil && !api.IsCode(err, api.CodeNotFound) {
			errs = append(errs, fmt.Errorf("release %s: %w", l.ID, err))
			continue
		}
		ids = append(ids, l.ID)
	}
	sort.Strings(ids)
	return ids, errors.Join(errs...)
}

// Env is what the job's environment gets for its leases, as TaskProlog
// lines ("export NAME=value"): for lease i, RIALTO_LEASE_<i>_ID, _KIND,
// _MODE, _SIZE, _URI (a single part's NBD or accel URI) and _PART_URIS
// (every part's, space-separated); RIALTO_LEASE_ID, RIALTO_LEASE_URI and
// RIALTO_LEASE_PART_URIS repeat lease 0's; RIALTO_LEASES lists the IDs.
// caFile, if set, is the cluster CA's certificate: the job gets it as
// RIALTO_CACERT and, when it is named ca-cert.pem (libnbd's and qemu's
// layout), nbds:// URIs carry ?tls-certificates= its directory, so that
// nbdinfo, nbdcopy and fio's nbd engine reach them as they are.
func Env(ls []api.Lease, caFile string) []string {
	var out, ids []string
	if caFile != "" {
		out = append(out, "export RIALTO_CACERT="+caFile)
	}
	tlsDir := ""
	if filepath.Base(caFile) == "ca-cert.pem" {
		tlsDir = filepath.Dir(caFile)
	}
	withTLS := func(uri string) string {
		u, err := nbd.ParseURI(uri)
		if tlsDir == "" || err != nil || !u.TLS || u.TLSCertificates != "" {
			return uri
		}
		u.TLSCertificates = tlsDir
		return u.String()
	}
	for i, l := range ls {
		var parts []string
		for _, p := range l.Parts {
			if p.URI != "" {
				parts = append(parts, withTLS(p.URI))
			}
		}
		size := l.Size
		if size == 0 {
			for _, p := range l.Parts {
				size += p.Length
			}
		}
		vals := [][2]string{{"ID", l.ID}, {"KIND", string(l.Kind)}, {"MODE", string(l.Mode)}, {"SIZE", strconv.FormatInt(size, 10)},
			{"URI", withTLS(l.URI)}, {"PART_URIS", strings.Join(parts, " ")}}
		for _, kv := range vals {
			out = append(out, fmt.Sprintf("export RIALTO_LEASE_%d_%s=%s", i, kv[0], kv[1]))
			if i == 0 && (kv[0] == "ID" || kv[0] == "URI" || kv[0] == "PART_URIS") {
				out = append(out, fmt.Sprintf("export RIALTO_LEASE_%s=%s", kv[0], kv[1]))
			}
		}
		ids = append(ids, l.ID)
	}
	out = append(out, "export RIALTO_LEASES="+strings.Join(ids, " "))
	return out
}

// failLine marks a job file that records a failure.
const failLine = "error "

// WriteFile records, for the TaskProlog, the job's environment lines or
// the reason its leases could not be made. The file is the job user's
// only (it holds data-plane URIs, which are secrets).
func WriteFile(stateDir string, j Job, lines []string, failure error) error {
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return err
	}
	// Another user who may create files in the directory could read a
	// job's URIs (a file put there before, which the write would keep),
	// or replace a job's file with lines of theirs, which the task prolog
	// puts in that job's environment.
	st, err := os.Lstat(stateDir)
	if err != nil {
		return err
	}
	if !st.IsDir() || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("slurm: state directory %s must be a directory only its owner can write (mode %04o): chmod 0711 %s", stateDir, st.Mode().Perm(), stateDir)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("slurm: state directory %s belongs to user %d, not to this process's (%d)", stateDir, sys.Uid, os.Geteuid())
	}
	var b strings.Builder
	if failure != nil {
		b.WriteString(failLine + strings.ReplaceAll(failure.Error(), "\n", " ") + "\n")
	}
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	p := j.File(stateDir)
	tmp := p + ".tmp"
	// A file left at tmp (a prolog killed midway) keeps its mode and
	// owner under O_TRUNC: remove it, and make a new one.
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if j.UID >= 0 && os.Geteuid() == 0 {
		if err := os.Chown(tmp, j.UID, j.GID); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	return os.Rename(tmp, p)
}

// TaskPrologLines turns the job file into TaskProlog output: export lines,
// or a print line with the failure (and failed true: the TaskProlog then
// exits non-zero, which fails the job). No file: nothing (the job asked
// for no devices).
func TaskPrologLines(stateDir string, j Job) (lines []string, failed bool, err error) {
	b, err := os.ReadFile(j.File(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if reason, ok := strings.CutPrefix(l, failLine); ok {
			return []string{"print rialto: the job's devices could not be leased: " + reason}, true, nil
		}
		if strings.HasPrefix(l, "export ") {
			lines = append(lines, l)
		}
	}
	return lines, false, nil
}
