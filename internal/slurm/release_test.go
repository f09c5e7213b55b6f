package slurm_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/slurm"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestEpilogReleasesOnlyItsJob: the epilog releases the leases of its
// job only, also when another cluster's name extends its own with a dash
// and a job ID and user (cluster "hpc", job 1 and cluster "hpc-1-u0",
// job 2, both of root, borrowing through one token: keys slurm-hpc-1-u0-…
// and slurm-hpc-1-u0-2-u0-…). Job 1's
// epilog released job 2's devices under it.
func TestEpilogReleasesOnlyItsJob(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.Client()
	req := []api.LeaseRequest{{Kind: api.KindBlock, Size: 4 << 20}}
	one := slurm.Job{Cluster: "hpc", ID: "1", UID: 0, GID: 0}
	two := slurm.Job{Cluster: "hpc-1-u0", ID: "2", UID: 0, GID: 0}
	l1, err := slurm.Ensure(ctx, cl, one, req)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := slurm.Ensure(ctx, cl, two, req)
	if err != nil {
		t.Fatal(err)
	}
	released, err := slurm.Release(ctx, cl, one)
	if err != nil {
		t.Fatal(err)
	}
	if len(released) != 1 || released[0] != l1[0].ID {
		t.Errorf("job %s/%s's epilog released %v; want only its lease %s", one.Cluster, one.ID, released, l1[0].ID)
	}
	if got, err := cl.Lease(ctx, l2[0].ID); err != nil || got.State != api.LeaseActive {
		t.Fatalf("job %s/%s's lease after the other job's epilog: %s, %v", two.Cluster, two.ID, got.State, err)
	}
	// Its own epilog releases it.
	if released, err := slurm.Release(ctx, cl, two); err != nil || len(released) != 1 || released[0] != l2[0].ID {
		t.Errorf("job %s/%s's epilog: %v, %v", two.Cluster, two.ID, released, err)
	}
}

// TestConcurrentEpilogs: the Epilog (on the node) and EpilogSlurmctld (on
// the controller) run at the same time when a job ends, and both release
// its leases. The one that loses the race found the lease released under
// it (409, "lease … is released") and failed, and a failing Epilog drains
// the node. Each must succeed, whichever wins.
func TestConcurrentEpilogs(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := c.Client()
	// Every job's leases first: a range released is wiped before it is
	// lent again.
	req := []api.LeaseRequest{{Kind: api.KindBlock, Size: 1 << 20}, {Kind: api.KindBlock, Size: 1 << 20}}
	var jobs []slurm.Job
	for n := 0; n < 16; n++ {
		j := slurm.Job{Cluster: "c", ID: strconv.Itoa(100 + n), UID: 1000, GID: 1000}
		if _, err := slurm.Ensure(ctx, cl, j, req); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	for _, j := range jobs {
		errs := make(chan error, 2)
		for range 2 {
			go func() { _, err := slurm.Release(ctx, cl, j); errs <- err }()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("job %s: an epilog racing the other: %v", j.ID, err)
			}
		}
	}
}

// TestJobIDReuse: Slurm reuses job IDs (a controller that lost its state
// starts again at FirstJobId; IDs wrap at MaxJobId) while the control plane
// still holds the first job's lease (its epilogs did not run: it lives to
// its TTL). The prolog borrows for every user through one token, so a key
// of cluster and job ID alone gave another user's job the first one's
// lease, credential and all, and that job's epilog released the first
// one's devices. The job's user is part of the key.
func TestJobIDReuse(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.Client()
	req := []api.LeaseRequest{{Kind: api.KindBlock, Size: 4 << 20}}
	alice := slurm.Job{Cluster: "hpc", ID: "5", UID: 1000, GID: 1000}
	mallory := slurm.Job{Cluster: "hpc", ID: "5", UID: 1001, GID: 1001}
	la, err := slurm.Ensure(ctx, cl, alice, req)
	if err != nil {
		t.Fatal(err)
	}
	lm, err := slurm.Ensure(ctx, cl, mallory, req)
	if err != nil {
		t.Fatal(err)
	}
	if lm[0].ID == la[0].ID || lm[0].URI == la[0].URI {
		t.Fatalf("uid %d's job %s got uid %d's lease %s (%s)", mallory.UID, mallory.ID, alice.UID, la[0].ID, lm[0].URI)
	}
	if released, err := slurm.Release(ctx, cl, mallory); err != nil || len(released) != 1 || released[0] != lm[0].ID {
		t.Errorf("uid %d's epilog released %v, %v; want only %s", mallory.UID, released, err, lm[0].ID)
	}
	if got, err := cl.Lease(ctx, la[0].ID); err != nil || got.State != api.LeaseActive {
		t.Fatalf("uid %d's lease after uid %d's epilog: %s, %v", alice.UID, mallory.UID, got.State, err)
	}
	// A job whose user is unknown gets nothing: its lease could not be
	// told from another user's.
	if _, err := slurm.Ensure(ctx, cl, slurm.Job{Cluster: "hpc", ID: "6", UID: -1, GID: -1}, req); err == nil {
		t.Error("a job without a uid got a lease")
	}
}

// TestEnvSizeIsHeld: a job's RIALTO_LEASE_i_SIZE is what its lease holds
// (the API's held: what nbdinfo --size says), not what the comment asked
// for. "block 16MiB dedicated" on 64 MiB disks holds a whole disk; the
// job was told 16 MiB.
func TestEnvSizeIsHeld(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reqs, err := slurm.ParseComment("rialto: block 16MiB dedicated; block whole")
	if err != nil {
		t.Fatal(err)
	}
	ls, err := slurm.Ensure(ctx, c.Client(), slurm.Job{Cluster: "hpc", ID: "9", UID: 0, GID: 0}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Join(slurm.Env(ls, ""), "\n")
	for i, l := range ls {
		if l.Held != 64<<20 {
			t.Fatalf("lease %d (%s) holds %d; want a whole 64MiB disk", i, l.ID, l.Held)
		}
		if want := "export RIALTO_LEASE_" + strconv.Itoa(i) + "_SIZE=" + strconv.FormatInt(l.Held, 10); !strings.Contains(env, want) {
			t.Errorf("lacks %q (size asked for %d):\n%s", want, l.Size, env)
		}
	}
}
