package slurm_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/slurm"
)

func TestParseComment(t *testing.T) {
	for _, tc := range []struct {
		comment string
		want    []api.LeaseRequest
		err     string
	}{
		{"", nil, ""},
		{"genomics run 7", nil, ""},
		{"rialto: block 100GiB composed 3", []api.LeaseRequest{{Kind: api.KindBlock, Size: 100 << 30, Mode: api.ModeComposed, Count: 3}}, ""},
		{"  Rialto:  memory 1GiB ttl=2h ; accel 2 role=sha256", []api.LeaseRequest{
			{Kind: api.KindMemory, Size: 1 << 30, TTLSeconds: 7200}, {Kind: api.KindAccel, Count: 2, Role: "sha256"}}, ""},
		{"rialto: block whole", []api.LeaseRequest{{Kind: api.KindBlock, Whole: true}}, ""},
		{"rialto: block 1GiB shared bandwidth=100MiB stripe=128KiB strategy=spread", []api.LeaseRequest{
			{Kind: api.KindBlock, Size: 1 << 30, Mode: api.ModeShared, Bandwidth: 100 << 20, StripeUnit: 128 << 10, Strategy: "spread"}}, ""},
		// bandwidth= takes a rate as --bandwidth does, decimal or bits.
		{"rialto: block 1GiB bandwidth=477MB/s; block 1GiB bandwidth=800Mbit/s", []api.LeaseRequest{
			{Kind: api.KindBlock, Size: 1 << 30, Bandwidth: 477e6}, {Kind: api.KindBlock, Size: 1 << 30, Bandwidth: 100e6}}, ""},
		{"rialto: block 1GiB bandwidth=fast", nil, "bandwidth"},
		{"rialto:", nil, "asks for nothing"},
		{"rialto: gpu 1", nil, "unknown kind"},
		{"rialto: block", nil, "a size is required"},
		{"rialto: block 1GiB colour=red", nil, "unknown option"},
		{"rialto: block 1GiB 0", nil, "between 1 and 64"},
		{"rialto: block lots", nil, "not a size"},
		{"rialto: block 1GiB ttl=soon", nil, "ttl"},
		{"rialto: " + strings.Repeat("memory 1MiB;", 9), nil, "at most 8"},
	} {
		got, err := slurm.ParseComment(tc.comment)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.comment, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.comment, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("%q: %+v, want %+v", tc.comment, got, tc.want)
			continue
		}
		for i := range got {
			if got[i].Kind != tc.want[i].Kind || got[i].Size != tc.want[i].Size || got[i].Mode != tc.want[i].Mode || got[i].Count != tc.want[i].Count ||
				got[i].TTLSeconds != tc.want[i].TTLSeconds || got[i].Role != tc.want[i].Role || got[i].Whole != tc.want[i].Whole ||
				got[i].Bandwidth != tc.want[i].Bandwidth || got[i].StripeUnit != tc.want[i].StripeUnit || got[i].Strategy != tc.want[i].Strategy {
				t.Errorf("%q: request %d is %+v, want %+v", tc.comment, i, got[i], tc.want[i])
			}
		}
	}
}

func TestJobFromEnv(t *testing.T) {
	env := map[string]string{"SLURM_CLUSTER_NAME": "c1", "SLURM_JOB_ID": "42", "SLURM_JOB_RESTART_COUNT": "2", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "100"}
	j, err := slurm.JobFromEnv(func(k string) string { return env[k] })
	if err != nil || j.Key(1) != "slurm-c1-42-u1000-2-1" || j.UID != 1000 || j.GID != 100 {
		t.Fatalf("%+v %v %s", j, err, j.Key(1))
	}
	for _, bad := range []string{"", "../42", "4 2", "42-u1", "42\n"} {
		env["SLURM_JOB_ID"] = bad
		if _, err := slurm.JobFromEnv(func(k string) string { return env[k] }); err == nil {
			t.Errorf("job ID %q accepted", bad)
		}
	}
	env["SLURM_JOB_ID"] = "42"
	for _, bad := range []string{"", "-1", "nobody"} {
		env["SLURM_JOB_UID"] = bad
		if _, err := slurm.JobFromEnv(func(k string) string { return env[k] }); err == nil {
			t.Errorf("uid %q accepted", bad)
		}
	}
}

// The job file: export lines for the task prolog, or the failure as a
// print line that fails the job; no file, nothing. The file is 0600.
func TestJobFile(t *testing.T) {
	dir := t.TempDir()
	j := slurm.Job{Cluster: "c", ID: "7", UID: -1, GID: -1}
	if lines, failed, err := slurm.TaskPrologLines(dir, j); err != nil || failed || lines != nil {
		t.Fatalf("no file: %v %v %v", lines, failed, err)
	}
	ls := []api.Lease{{ID: "lease-a", Kind: api.KindBlock, Mode: api.ModeComposed, Size: 3 << 20,
		Parts: []api.Part{{URI: "nbd://h:1/x"}, {URI: "nbd://h:2/y"}, {URI: "nbd://h:3/z"}}}}
	if err := slurm.WriteFile(dir, j, slurm.Env(ls, ""), nil); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "c-7.env")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("job file: %v %v", st, err)
	}
	lines, failed, err := slurm.TaskPrologLines(dir, j)
	got := strings.Join(lines, "\n")
	for _, want := range []string{"export RIALTO_LEASE_ID=lease-a", "export RIALTO_LEASE_0_MODE=composed", "export RIALTO_LEASE_0_SIZE=3145728",
		"export RIALTO_LEASE_PART_URIS=nbd://h:1/x nbd://h:2/y nbd://h:3/z", "export RIALTO_LEASES=lease-a"} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	if failed || err != nil {
		t.Fatal(failed, err)
	}
	// Over TLS: the CA for the job, and libnbd's tls-certificates on nbds
	// URIs.
	tlsLines := strings.Join(slurm.Env([]api.Lease{{ID: "lease-b", Kind: api.KindBlock, URI: "nbds://h:1/x",
		Parts: []api.Part{{URI: "nbds://h:1/x"}}}}, "/etc/rialto/tls/ca-cert.pem"), "\n")
	for _, want := range []string{"export RIALTO_CACERT=/etc/rialto/tls/ca-cert.pem",
		"export RIALTO_LEASE_URI=nbds://h:1/x?tls-certificates=/etc/rialto/tls", "export RIALTO_LEASE_PART_URIS=nbds://h:1/x?tls-certificates=/etc/rialto/tls"} {
		if !strings.Contains(tlsLines, want) {
			t.Errorf("lacks %q:\n%s", want, tlsLines)
		}
	}
	if err := slurm.WriteFile(dir, j, nil, os.ErrDeadlineExceeded); err != nil {
		t.Fatal(err)
	}
	lines, failed, _ = slurm.TaskPrologLines(dir, j)
	if !failed || len(lines) != 1 || !strings.HasPrefix(lines[0], "print rialto: the job's devices could not be leased: ") {
		t.Fatalf("failure lines %q %v", lines, failed)
	}
}

// TestJobFileNeverReadableByOthers: the job's file holds its lease URIs
// (credentials). A .tmp left in the state directory (a prolog killed
// midway, or put there) kept its mode and owner under the write, so the
// job's file came out 0644; a symbolic link there was followed. A
// directory others may write is refused: they could read a job's file as
// it is written, or put lines of theirs in another user's job.
func TestJobFileNeverReadableByOthers(t *testing.T) {
	ls := []api.Lease{{ID: "lease-a", Kind: api.KindBlock, URI: "nbds://h:1/rlc_secret-export-name"}}
	j := slurm.Job{Cluster: "c", ID: "8", UID: -1, GID: -1}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c-8.env.tmp"), []byte("left over\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "c-8.env.tmp"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := slurm.WriteFile(dir, j, slurm.Env(ls, ""), nil); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "c-8.env"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("the job's file is %04o after a left-over .tmp of mode 0644, want 0600", st.Mode().Perm())
	}

	elsewhere := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(elsewhere, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "c-8.env.tmp"))
	if err := os.Symlink(elsewhere, filepath.Join(dir, "c-8.env.tmp")); err != nil {
		t.Fatal(err)
	}
	if err := slurm.WriteFile(dir, j, slurm.Env(ls, ""), nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(elsewhere); strings.Contains(string(b), "rlc_secret") {
		t.Errorf("the write followed a symbolic link at .tmp: the URIs are in %s", elsewhere)
	}
	if st, err := os.Lstat(filepath.Join(dir, "c-8.env")); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Errorf("the job's file after a .tmp link: %v %v", st, err)
	}

	open := filepath.Join(t.TempDir(), "spool")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	err = slurm.WriteFile(open, j, slurm.Env(ls, ""), nil)
	if err == nil || !strings.Contains(err.Error(), "chmod 711") {
		t.Errorf("a state directory every user may write: %v", err)
	}
	if _, err := os.Stat(filepath.Join(open, "c-8.env")); err == nil {
		t.Errorf("the job's file was written into a directory every user may write")
	}
}

// FuzzParseComment: any comment parses or is refused with an error,
// never a crash, and what parses is a request of a known kind.
func FuzzParseComment(f *testing.F) {
	for _, s := range []string{"rialto: block 100GiB composed 3", "rialto: memory 1GiB ttl=2h; accel 2 role=x", "rialto: block whole", "rialto:;;", "rialto: block 1e9 9999999999999999999", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, c string) {
		rs, err := slurm.ParseComment(c)
		if err != nil {
			return
		}
		if len(rs) > slurm.MaxLeases {
			t.Fatalf("%d requests", len(rs))
		}
		for _, r := range rs {
			if r.Kind != api.KindBlock && r.Kind != api.KindMemory && r.Kind != api.KindAccel || r.Size < 0 || r.Count < 0 {
				t.Fatalf("%q: %+v", c, r)
			}
		}
	})
}

// TestWriteFileStateDir: the prolog writes the job file as root and gives
// it to the job's user. In a state directory others can write (a
// --state-dir of /tmp, say), a user planted a symlink where the prolog
// writes (CLUSTER-JOBID.env.tmp) and the prolog wrote through it and
// chowned its target to the user: any file of root's became the user's.
// The prolog refuses such a directory, and never writes through a link.
func TestWriteFileStateDir(t *testing.T) {
	j := slurm.Job{Cluster: "c", ID: "7", UID: 4242, GID: 4242}
	victim := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(victim, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := t.TempDir()
	if err := os.Chmod(open, 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(open, "c-7.env.tmp")); err != nil {
		t.Fatal(err)
	}
	err := slurm.WriteFile(open, j, []string{"export RIALTO_LEASE_ID=x"}, nil)
	if err == nil || !strings.Contains(err.Error(), "writable") {
		t.Errorf("a state directory others can write: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's\n" {
		t.Errorf("the prolog wrote through a planted link: %q", b)
	}
	if st, err := os.Stat(victim); err != nil || st.Sys().(*syscall.Stat_t).Uid == 4242 {
		t.Errorf("the prolog gave the link's target to the job's user: %v", err)
	}
	// In a sound directory, a link left where the file goes is replaced,
	// not followed.
	dir := t.TempDir()
	for _, name := range []string{"c-7.env.tmp", "c-7.env"} {
		if err := os.Symlink(victim, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := slurm.WriteFile(dir, j, []string{"export RIALTO_LEASE_ID=x"}, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's\n" {
		t.Errorf("the prolog wrote through a link: %q", b)
	}
	if st, err := os.Lstat(filepath.Join(dir, "c-7.env")); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Errorf("job file: %v %v", st, err)
	}
}
