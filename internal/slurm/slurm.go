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
	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/resource"
)

// Prefix starts a job comment that asks Rialto for devices.
const Prefix = "rialto:"

// releaseBudget bounds how long a prolog that failed spends releasing
// the leases it made.
const releaseBudget = 30 * time.Second

// MaxLeases bounds the leases one job may ask for.
const MaxLeases = 8

// ParseComment reads the lease requests of a job comment:
//
//	rialto: REQUEST [; REQUEST]...
//	REQUEST = KIND [SIZE] [dedicated|shared|composed|whole] [COUNT] [ttl=DURATION] [stripe=SIZE] [role=NAME] [strategy=binpack|spread] [bandwidth=RATE]
//
// KIND is block, memory or accel; SIZE is a size such as 100GiB (block,
// memory); COUNT the number of parts (composed) or slots (accel); RATE a
// rate as --bandwidth takes it (477MB/s, 800Mbit/s). A comment without
// the prefix asks for nothing (nil, nil).
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
				bw, err := resource.ParseRate(v)
				if err != nil {
					return r, fmt.Errorf("bandwidth: %w", err)
				}
				r.Bandwidth = bw
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

var (
	clusterRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	numRe     = regexp.MustCompile(`^[0-9]{1,10}$`)
)

// JobFromEnv reads a Job from Slurm's prolog/epilog environment. Slurm
// sets these variables (the job's user cannot): the job ID, the uid and
// the restart count are numbers, the uid is required (a lease is the
// user's as much as the job's: keyPrefix).
func JobFromEnv(getenv func(string) string) (Job, error) {
	j := Job{Cluster: getenv("SLURM_CLUSTER_NAME"), ID: getenv("SLURM_JOB_ID"), Comment: getenv("SLURM_JOB_COMMENT"), UID: -1, GID: -1}
	if j.Cluster == "" {
		j.Cluster = "slurm"
	}
	if !numRe.MatchString(j.ID) || !clusterRe.MatchString(j.Cluster) {
		return j, fmt.Errorf("slurm: SLURM_JOB_ID %q or SLURM_CLUSTER_NAME %q missing or malformed (run from a Slurm prolog or epilog)", j.ID, j.Cluster)
	}
	uid := getenv("SLURM_JOB_UID")
	if !numRe.MatchString(uid) {
		return j, fmt.Errorf("slurm: SLURM_JOB_UID %q missing or malformed (run from a Slurm prolog or epilog)", uid)
	}
	j.UID, _ = strconv.Atoi(uid)
	if v := getenv("SLURM_JOB_RESTART_COUNT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return j, fmt.Errorf("slurm: SLURM_JOB_RESTART_COUNT %q is not a count", v)
		}
		j.Restarts = n
	}
	if v := getenv("SLURM_JOB_GID"); numRe.MatchString(v) {
		j.GID, _ = strconv.Atoi(v)
	}
	return j, nil
}

// keyPrefix starts the idempotency keys of every lease of the job, in
// every run of it: the cluster, the job ID and the job's user. The user
// is there because job IDs are reused (a controller that lost its state
// starts again at FirstJobId; IDs wrap at MaxJobId) while a lease may
// outlive its job to its TTL, and every user borrows through the one
// token: with the ID alone, another user's job with the same ID would get
// the earlier job's lease (credential and all) from the idempotent create,
// and its epilog would release it.
func (j Job) keyPrefix() string {
	return "slurm-" + j.Cluster + "-" + j.ID + "-u" + strconv.Itoa(j.UID) + "-"
}

// Key is the idempotency key of request i of this run of the job.
func (j Job) Key(i int) string { return fmt.Sprintf("%s%d-%d", j.keyPrefix(), j.Restarts, i) }

// runKeyRe is what follows the job's prefix in the key of one of its
// leases (Key): the run's restart count and the request's index.
var runKeyRe = regexp.MustCompile(`^[0-9]+-[0-9]+$`)

// owns reports whether key is the idempotency key of a lease of the job,
// in any run of it: its prefix followed by a run's restart count and a
// request's index, and nothing else. The prefix alone is not enough:
// cluster names may hold dashes, so job 2 of cluster "hpc-1-u0" (user 0:
// slurm-hpc-1-u0-2-u0-0-0) starts with job 1 of cluster "hpc"'s prefix
// (slurm-hpc-1-u0-).
func (j Job) owns(key string) bool {
	rest, ok := strings.CutPrefix(key, j.keyPrefix())
	return ok && runKeyRe.MatchString(rest)
}

// File is the job's file in the state directory.
func (j Job) File(stateDir string) string {
	return filepath.Join(stateDir, j.Cluster+"-"+j.ID+".env")
}

// retry calls f until it returns an error other than one of a request
// the control plane did not answer (api.Unanswered), or ctx ends: a
// control plane restarting (an upgrade, a failover to a standby) must not
// fail the jobs that start or end meanwhile, nor drain their nodes. Every
// request retried is idempotent (a creation carries the job's key). The
// error after ctx ends says how long the control plane was unreachable.
func retry(ctx context.Context, f func() error) error {
	b := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	start := time.Now()
	for {
		err := f()
		if !api.Unanswered(err) {
			return err
		}
		if werr := b.Wait(ctx); werr != nil {
			return fmt.Errorf("the control plane did not answer for %s: %w", time.Since(start).Round(100*time.Millisecond), err)
		}
	}
}

// Ensure creates (or, on a retry, finds again) the leases the job's
// comment asks for. When one cannot be placed, those already made for
// this run are released and the error carries the control plane's reason.
func Ensure(ctx context.Context, c *api.Client, j Job, reqs []api.LeaseRequest) ([]api.Lease, error) {
	if j.UID < 0 {
		return nil, fmt.Errorf("slurm: job %s has no uid: its leases could not be told from another user's job of the same ID", j.ID)
	}
	var out []api.Lease
	for i, r := range reqs {
		r.IdempotencyKey = j.Key(i)
		r.Borrower = "slurm job " + j.ID + " (" + j.Cluster + ", uid " + strconv.Itoa(j.UID) + ")"
		// The job is in the key and the borrower: a request's labels are
		// node selectors in Rialto, not tags of the lease.
		var l api.Lease
		err := retry(ctx, func() (err error) { l, err = c.CreateLease(ctx, r); return err })
		if err == nil && l.State.Terminal() {
			err = fmt.Errorf("lease %s of this job is already %s (%s)", l.ID, l.State, l.Reason)
		}
		if err != nil {
			// Bounded: a control plane that hangs must not hang the
			// prolog (the epilogs release by key what this leaves).
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseBudget)
			for _, m := range out {
				release(rctx, c, m.ID)
			}
			cancel()
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
	if j.UID < 0 {
		return nil, fmt.Errorf("slurm: job %s has no uid: its leases could not be told from another user's job of the same ID", j.ID)
	}
	var ls []api.Lease
	if err := retry(ctx, func() (err error) { ls, err = c.Leases(ctx); return err }); err != nil {
		return nil, err
	}
	var ids []string
	var errs []error
	for _, l := range ls {
		if !j.owns(l.IdempotencyKey) {
			continue
		}
		if err := release(ctx, c, l.ID); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", l.ID, err))
			continue
		}
		ids = append(ids, l.ID)
	}
	sort.Strings(ids)
	return ids, errors.Join(errs...)
}

// release releases one lease. The node's Epilog and the controller's
// EpilogSlurmctld run at once when a job ends: a release that finds the
// lease released (or releasing, or gone) under it by the other has done
// its work, not failed (a failing Epilog drains the node).
func release(ctx context.Context, c *api.Client, id string) error {
	err := retry(ctx, func() error { _, err := c.ReleaseLease(ctx, id); return err })
	if err == nil || api.IsCode(err, api.CodeNotFound) {
		return nil
	}
	if !api.IsCode(err, api.CodeConflict) {
		return err
	}
	l, gerr := c.Lease(ctx, id)
	if api.IsCode(gerr, api.CodeNotFound) || gerr == nil && (l.State.Terminal() || l.State == api.LeaseReleasing) {
		return nil
	}
	return err
}

// Env is what the job's environment gets for its leases, as TaskProlog
// lines ("export NAME=value"): for lease i, RIALTO_LEASE_<i>_ID, _KIND,
// _MODE, _SIZE (what the lease holds, the API's held), _URI (a single part's NBD or accel URI) and _PART_URIS
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
		// What the lease holds (what nbdinfo --size says): more than
		// the size asked for when it holds a whole device, a device
		// larger than the size (dedicated) or parts rounded up to its
		// stripe unit. A lease that holds nothing says its size.
		size := l.Held
		if size == 0 {
			size = l.Size
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

// CheckStateDir makes the state directory (mode 0711) or checks the one
// there: the prolog writes job files there as root and gives them to the
// jobs' users, so a directory anyone else may write to (or that is not
// the prolog's) would let a user plant a link or a file of theirs where a
// job file goes.
func CheckStateDir(stateDir string) error {
	if err := os.MkdirAll(stateDir, 0o711); err != nil {
		return fmt.Errorf("slurm: state directory: %w", err)
	}
	st, err := os.Stat(stateDir)
	if err != nil {
		return fmt.Errorf("slurm: state directory: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("slurm: state directory %s is not a directory", stateDir)
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("slurm: state directory %s is writable by others (mode %04o): it must be the prolog's only (chmod 711)", stateDir, st.Mode().Perm())
	case ok && int(sys.Uid) != os.Geteuid():
		return fmt.Errorf("slurm: state directory %s is owned by uid %d, not the prolog's (%d)", stateDir, sys.Uid, os.Geteuid())
	}
	return nil
}

// maxReason bounds the failure reason a job file keeps: a comment of any
// length may be quoted in it, and the TaskProlog prints it as one line.
const maxReason = 2000

// WriteFile records, for the TaskProlog, the job's environment lines or
// the reason its leases could not be made. The file is the job user's
// only (it holds data-plane URIs, which are secrets); it is written under
// a fresh name (never through a link) and renamed into place.
func WriteFile(stateDir string, j Job, lines []string, failure error) error {
	if err := CheckStateDir(stateDir); err != nil {
		return err
	}
	var b strings.Builder
	if failure != nil {
		reason := strings.Map(func(r rune) rune {
			if r < ' ' || r == 0x7f {
				return ' '
			}
			return r
		}, failure.Error())
		if len(reason) > maxReason {
			reason = strings.ToValidUTF8(reason[:maxReason], "") + " ..."
		}
		b.WriteString(failLine + reason + "\n")
	}
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	p := j.File(stateDir)
	f, err := os.CreateTemp(stateDir, filepath.Base(p)+".tmp*") // O_EXCL, mode 0600
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.WriteString(b.String())
	if err == nil && j.UID >= 0 && os.Geteuid() == 0 {
		err = f.Chown(j.UID, j.GID)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("slurm: job file: %w", err)
	}
	return nil
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
