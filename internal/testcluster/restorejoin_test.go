package testcluster

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/logtest"
)

// backupDB backs the running control plane's database up online, as
// docs/operations.md ("Backups and restore") says (VACUUM INTO), and
// returns the backup's path.
func backupDB(t *testing.T, c *Cluster) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rialto-backup.db")
	db, err := sql.Open("sqlite", "file:"+c.dbPath+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctxT(t), `VACUUM INTO ?`, path); err != nil {
		t.Fatalf("backup: %v", err)
	}
	return path
}

// restoreDB restores a backup as docs/operations.md says: the server
// stopped, the .db file replaced, stale -wal and -shm deleted, the server
// started.
func restoreDB(t *testing.T, c *Cluster, backup string) {
	t.Helper()
	c.StopControlPlane()
	b, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.dbPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ext := range []string{"-wal", "-shm"} {
		if err := os.Remove(c.dbPath + ext); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	c.StartControlPlane()
}

// identityFile is the part of an agent's identity.json these tests read,
// with the file's mode.
type identityFile struct {
	MachineID           string   `json:"machine_id"`
	Credential          string   `json:"credential"`
	PreviousCredentials []string `json:"previous_credentials"`
	mode                os.FileMode
}

func readIdentityFile(t *testing.T, n *Node) identityFile {
	t.Helper()
	path := filepath.Join(n.StateDir, "identity.json")
	var id identityFile
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &id)
	}
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	id.mode = fi.Mode().Perm()
	return id
}

// TestRestoredDatabaseRejoinProven: the control plane's database is
// restored from a backup taken before the lender's agent last rejoined
// (a restart: a new credential), in a cluster without a cluster CA. The
// restored database knows the credential issued before the backup, which
// the agent replaced since but keeps among its previous credentials
// (identity.json, 0600) and presents with its current one. Its rejoin
// (its heartbeat refused, 401) is accepted at once, as the node's agent's:
// the same node, still ready, its lease active and served with its bytes,
// not refused while the node is live and then taken over as a lost-state
// join.
func TestRestoredDatabaseRejoinProven(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1})
	ctx := ctxT(t)
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	n := c.Nodes[0]
	id := n.ID()
	pat := bytes.Repeat([]byte("restored "), 512)
	nc, err := nbd.DialURI(ctx, l.URI)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.WriteAtContext(ctx, pat, 0, true); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	backup := backupDB(t, c)
	old := readIdentityFile(t, n).Credential
	n.Restart()
	cur := readIdentityFile(t, n)
	if cur.Credential == old || len(cur.PreviousCredentials) == 0 || cur.PreviousCredentials[0] != old || cur.mode != 0o600 {
		t.Fatalf("after the rejoin: a new credential %v, the previous one kept first %v, mode %v",
			cur.Credential != old, len(cur.PreviousCredentials) > 0 && cur.PreviousCredentials[0] == old, cur.mode)
	}

	// From here on the agent's joins are counted.
	var tries atomic.Int32
	hook := func(context.Context) { tries.Add(1) }
	n.Faults().BeforeJoin.Store(&hook)
	restoreDB(t, c, backup)
	c.Eventually("the agent's rejoin, accepted or tried again", func() bool {
		return tries.Load() >= 2 || readIdentityFile(t, n).Credential != cur.Credential
	})
	if k := tries.Load(); k != 1 {
		t.Fatalf("the agent tried %d joins: its credentials did not prove it is the node's agent", k)
	}
	if got := n.ID(); got != id {
		t.Fatalf("rejoined as %s, not %s", got, id)
	}
	if s := c.NodeState(id); s != api.NodeReady {
		t.Fatalf("node %s", s)
	}
	if got := c.Lease(l.ID); got.State != api.LeaseActive {
		t.Fatalf("the lease after the rejoin: %s (%q)", got.State, got.Reason)
	}
	evs, err := c.Client().Events(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var joined api.Event
	for _, e := range evs {
		if e.Type == "node.joined" && e.Subject == id {
			joined = e
		}
	}
	if !strings.Contains(joined.Message, "joined") || strings.Contains(joined.Message, "took") {
		t.Fatalf("the rejoin's event: %+v", joined)
	}
	c.Eventually("the lease served again", func() bool { return n.Serves(l.ID) })
	nc, err = nbd.DialURI(ctx, c.Lease(l.ID).URI)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make([]byte, len(pat))
	if _, err := nc.ReadAtContext(ctx, got, 0); err != nil || !bytes.Equal(got, pat) {
		t.Fatalf("the lease's bytes after the restore: %v", err)
	}
	if now := readIdentityFile(t, n); len(now.PreviousCredentials) < 2 || now.PreviousCredentials[0] != cur.Credential || now.PreviousCredentials[1] != old {
		t.Fatal("the agent's previous credentials after the rejoin are not its last two, newest first")
	}
}

// TestTakenOverCredentialsRefused: a lender's agent, restarted once (its
// previous credential kept), is down; another machine claiming its
// machine ID takes the node over. The agent, restarted with its state,
// presents its current and previous credentials, none of which is the
// node's any more: its joins are refused while the newcomer's node is
// ready, and it takes the node back, as a lost-state join, only once that
// is down.
func TestTakenOverCredentialsRefused(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 2})
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	lender := c.NodeByID(l.NodeID)
	id := lender.ID()
	node, err := c.Client().Node(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	lender.Restart()
	if prev := readIdentityFile(t, lender).PreviousCredentials; len(prev) != 1 {
		t.Fatalf("%d previous credentials after one rejoin", len(prev))
	}
	lender.Kill()
	makeDown(t, c, id)
	if got := c.JoinAgentless("impostor", node.Fingerprint.MachineID, 64<<20); got != id {
		t.Fatalf("the takeover joined as %s, not %s", got, id)
	}
	launchRefused(t, c, lender, id)
}

// TestDamagedPreviousCredentialsRejoin: an agent whose identity.json was
// edited by hand or damaged holds previous credentials a join cannot
// present (empty ones, repeats, its current credential, ones longer than
// api.MaxCredentialLen, more than api.MaxPreviousCredentials). It loads
// the newest valid ones, drops the rest with a warning that names no
// credential, and joins: here, after a restore of the control plane's
// database from a backup, proven by the credential the backup knows,
// which comes after more than api.MaxPreviousCredentials entries in the
// file. It presented them all: the control plane refused the join (400),
// and the agent, taking that for final, never joined.
func TestDamagedPreviousCredentialsRejoin(t *testing.T) {
	t.Parallel()
	log, logs := logtest.Logger(nil)
	c := Start(t, Options{Nodes: 1, Logger: log})
	l := createBlock(t, c.Client(), 4<<20, api.ModeShared)
	n := c.Nodes[0]
	id := n.ID()
	backup := backupDB(t, c)
	old := readIdentityFile(t, n).Credential
	n.Restart()
	cur := readIdentityFile(t, n).Credential
	n.Kill()

	// The credential the backup knows comes tenth; the newest valid ones
	// are gone1, gone2, gone3, it, and gone4 to gone7.
	long := "rnc_" + strings.Repeat("x", api.MaxCredentialLen)
	gone := func(i int) string { return "rnc_gone-" + strconv.Itoa(i) }
	damaged := []string{"", long, cur, gone(1), gone(1), "", gone(2), long, gone(3), old}
	for i := 4; i <= 9; i++ {
		damaged = append(damaged, gone(i))
	}
	editIdentity(t, n.StateDir, func(idf map[string]any) { idf["previous_credentials"] = damaged })
	restoreDB(t, c, backup)

	var tries atomic.Int32
	hook := func(context.Context) { tries.Add(1) }
	n.LaunchWith(func(a *agent.Agent) { a.Faults.BeforeJoin.Store(&hook) })
	n.WaitReady()
	if k := tries.Load(); k != 1 {
		t.Fatalf("the agent tried %d joins: the credential the backup knows did not prove it is the node's agent", k)
	}
	if got := n.ID(); got != id {
		t.Fatalf("rejoined as %s, not %s", got, id)
	}
	if got := c.Lease(l.ID); got.State != api.LeaseActive {
		t.Fatalf("the lease after the rejoin: %s (%q)", got.State, got.Reason)
	}
	now := readIdentityFile(t, n)
	want := []string{cur, gone(1), gone(2), gone(3), old, gone(4), gone(5), gone(6)}
	if !slices.Equal(now.PreviousCredentials, want) {
		t.Fatalf("previous credentials after the rejoin: %d of them, want the one it replaced, then the newest valid ones of the file", len(now.PreviousCredentials))
	}
	out := logs.String()
	if !strings.Contains(out, "dropped previous credentials") {
		t.Fatal("no warning of the dropped previous credentials")
	}
	for _, s := range append([]string{long, old, cur}, want[1:]...) {
		if strings.Contains(out, s) {
			t.Fatal("a credential reached the log")
		}
	}
}

// editedIdentity starts a one-node cluster (opts, with its log in
// logs), gives the node a block lease, stops its agent and edits its
// identity.json; the node's ID before is id.
func editedIdentity(t *testing.T, opts Options, edit func(map[string]any)) (c *Cluster, n *Node, l api.Lease, id string, logs *logtest.Buffer) {
	t.Helper()
	opts.Nodes = 1
	opts.Logger, logs = logtest.Logger(nil)
	c = Start(t, opts)
	l = createBlock(t, c.Client(), 4<<20, api.ModeShared)
	n = c.Nodes[0]
	id = n.ID()
	n.Kill()
	editIdentity(t, n.StateDir, edit)
	return c, n, l, id, logs
}

// rejoinsAtOnce launches n again and checks that it rejoins at once as
// node id, its lease l kept.
func rejoinsAtOnce(t *testing.T, c *Cluster, n *Node, id string, l api.Lease) {
	t.Helper()
	n.Launch()
	n.WaitReady()
	if got := n.ID(); got != id {
		t.Fatalf("rejoined as %s, not %s", got, id)
	}
	if got := c.Lease(l.ID); got.State != api.LeaseActive {
		t.Fatalf("the lease after the rejoin: %s (%q)", got.State, got.Reason)
	}
}

// TestOverlongCredentialJoinsUnproven: an agent whose identity.json holds
// a current credential longer than api.MaxCredentialLen (edited by hand,
// damaged), which the control plane would refuse (400) in every join,
// drops it as it loads the file, with a warning that names the file and
// not the credential, and joins without it: unproven (no cluster CA
// here), so as a lost-state join, refused while the node is live and
// taking it over once it is down, its lease lost. It presented the
// credential: the join was refused (400) and the agent stopped, and
// stopped again at every restart.
func TestOverlongCredentialJoinsUnproven(t *testing.T) {
	t.Parallel()
	long := "rnc_" + strings.Repeat("z", api.MaxCredentialLen)
	c, n, l, id, logs := editedIdentity(t, Options{}, func(idf map[string]any) { idf["credential"] = long })

	launchRefused(t, c, n, id)
	if got := c.Lease(l.ID); got.State != api.LeaseLost {
		t.Fatalf("the lease after the unproven join: %s (%q)", got.State, got.Reason)
	}
	now := readIdentityFile(t, n)
	if now.Credential == "" || len(now.Credential) > api.MaxCredentialLen || slices.Contains(now.PreviousCredentials, long) {
		t.Fatalf("identity.json after the join: a credential of %d bytes, the dropped one kept among the previous ones: %v",
			len(now.Credential), slices.Contains(now.PreviousCredentials, long))
	}
	out := logs.String()
	if !strings.Contains(out, "dropped its current credential") || !strings.Contains(out, filepath.Join(n.StateDir, "identity.json")) {
		t.Fatal("no warning naming identity.json of the dropped credential")
	}
	if strings.Contains(out, long[:64]) {
		t.Fatal("the credential reached the log")
	}
}

// TestOverlongMachineIDRejoinsAtOnce: an agent whose identity.json holds
// a machine_id longer than the control plane takes (a hand edit, damage)
// uses the one derived from its host and name, which is what it joined
// with: it rejoins at once, the same node, its lease kept, and says so.
// Before, every join was refused (400) and the agent stopped.
func TestOverlongMachineIDRejoinsAtOnce(t *testing.T) {
	t.Parallel()
	var before string
	c, n, l, id, logs := editedIdentity(t, Options{}, func(idf map[string]any) {
		before, _ = idf["machine_id"].(string)
		idf["machine_id"] = strings.Repeat("m", api.MaxMachineIDLen+1)
	})
	rejoinsAtOnce(t, c, n, id, l)
	if now := readIdentityFile(t, n).MachineID; before == "" || now != before {
		t.Fatalf("identity.json's machine_id after the rejoin: %q, want %q", now, before)
	}
	if out := logs.String(); !strings.Contains(out, "its machine_id is longer") || !strings.Contains(out, filepath.Join(n.StateDir, "identity.json")) {
		t.Fatal("no warning naming identity.json of the machine_id replaced")
	}
}

// TestTLSOverlongCredentialRejoinsAtOnce: with a cluster CA, an agent
// whose identity.json holds an over-long current credential drops it and
// proves its join with its node certificate, still valid: it rejoins at
// once, the same node, its lease kept.
func TestTLSOverlongCredentialRejoinsAtOnce(t *testing.T) {
	t.Parallel()
	c, n, l, id, _ := editedIdentity(t, Options{TLS: true}, func(idf map[string]any) {
		idf["credential"] = "rnc_" + strings.Repeat("z", api.MaxCredentialLen)
	})
	rejoinsAtOnce(t, c, n, id, l)
	c.Eventually("the lease served again", func() bool { return n.Serves(l.ID) })
}
