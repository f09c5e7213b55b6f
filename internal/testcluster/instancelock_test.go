package testcluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"

	"github.com/rialto-project/rialto/internal/loopdevtest"
)

// TestSecondAgentOnLentDeviceRefused: a second agent started on the same
// machine while the first still runs (another working directory, so a
// fresh state directory) and lending the same block device — the same
// file, another path to it, or a real block device's node — would take
// the device's bytes for lost state and wipe them under the first agent's
// live lease. It refuses to start, naming the device and the process
// holding it, and touches nothing: the tenant still reads her bytes
// through the first agent. Once the first has stopped, the second starts.
func TestSecondAgentOnLentDeviceRefused(t *testing.T) {
	t.Parallel()
	const dev = 8 << 20
	for _, tc := range []struct {
		name string
		// device is the path the first agent lends, and the path to the
		// same device the second one is given.
		device func(t *testing.T) (first, second string)
	}{
		{"file", func(t *testing.T) (string, string) {
			p := filepath.Join(t.TempDir(), "disk0.img")
			return p, p
		}},
		{"another path to the file", func(t *testing.T) (string, string) {
			p := filepath.Join(t.TempDir(), "disk0.img")
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(t.TempDir(), "link.img")
			if err := os.Symlink(p, link); err != nil {
				t.Fatal(err)
			}
			return p, link
		}},
		{"block device", func(t *testing.T) (string, string) {
			p := filepath.Join(t.TempDir(), "backing.img")
			if err := os.WriteFile(p, make([]byte, dev), 0o600); err != nil {
				t.Fatal(err)
			}
			d := loopdevtest.Attach(t, p)
			return d, d
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			first, second := tc.device(t)
			c := Start(t, Options{Nodes: 1, Tenants: []string{"alice"},
				Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: first, Size: dev}}})
			ctx := ctxT(t)
			alice := c.ClientWithToken(TenantToken("alice"))
			la, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Size: dev})
			if err != nil {
				t.Fatal(err)
			}
			fillParts(ctx, t, la, "alice")

			n := c.Nodes[0]
			cfg := n.cfg
			cfg.StateDir = filepath.Join(t.TempDir(), "elsewhere")
			cfg.Devices = []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: second, Size: dev}}
			err = refusedAgent(t, cfg)
			if !errors.Is(err, agent.ErrInUse) {
				t.Fatalf("a second agent lending %s: %v, want ErrInUse", second, err)
			}
			for _, want := range []string{second, "in use by another rialto agent", fmt.Sprintf("pid %d", os.Getpid())} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal %q does not say %q", err, want)
				}
			}
			if got := c.Lease(la.ID); got.State != api.LeaseActive {
				t.Fatalf("alice's lease after the refused start: %s (%q)", got.State, got.Reason)
			}
			if !partsHold(ctx, t, la, "alice") {
				t.Fatal("alice's bytes changed under her lease")
			}

			// (A fresh state directory: it joins once the node is down.)
			id := n.ID()
			n.Kill()
			n.cfg = cfg
			launchRefused(t, c, n, id)
		})
	}
}

// TestSecondAgentOnStateDirRefused: a second agent on the state directory
// of a running one (started twice by mistake) would rewrite its identity,
// exports and wipe journal under it. It refuses to start, naming the
// directory and the process holding it, and changes none of its files;
// the first keeps serving. Restarted once the first has stopped, the agent
// starts on the directory as usual and serves the lease again.
func TestSecondAgentOnStateDirRefused(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Nodes: 1, Tenants: []string{"alice"}})
	ctx := ctxT(t)
	alice := c.ClientWithToken(TenantToken("alice"))
	la, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	fillParts(ctx, t, la, "alice")
	n := c.Nodes[0]
	files := func() map[string]string {
		m := map[string]string{}
		for _, f := range []string{"identity.json", "exports.json", "wipes.json"} {
			b, err := os.ReadFile(filepath.Join(n.StateDir, f))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			m[f] = string(b)
		}
		return m
	}
	before := files()

	err = refusedAgent(t, n.cfg)
	if !errors.Is(err, agent.ErrInUse) {
		t.Fatalf("a second agent on the state directory: %v, want ErrInUse", err)
	}
	for _, want := range []string{"state directory " + n.StateDir, "in use by another rialto agent", fmt.Sprintf("pid %d", os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	for f, b := range files() {
		if b != before[f] {
			t.Errorf("%s changed by the refused start:\n%s\nwas\n%s", f, b, before[f])
		}
	}
	if !n.Serves(la.ID) || !partsHold(ctx, t, la, "alice") {
		t.Fatal("the running agent no longer serves alice's bytes")
	}

	n.Restart()
	if got := c.Lease(la.ID); got.State != api.LeaseActive || !n.Serves(la.ID) {
		t.Fatalf("alice's lease after the restart: %s, served %v", got.State, n.Serves(la.ID))
	}
	if !partsHold(ctx, t, la, "alice") {
		t.Fatal("alice's bytes changed by the restart")
	}
}

// refusedAgent runs an agent on cfg and returns the error it stops with;
// an agent that gets ready instead fails the test.
func refusedAgent(t *testing.T, cfg agent.Config) error {
	t.Helper()
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the second agent stopped without an error")
		}
		t.Logf("refused: %v", err)
		return err
	case <-a.Ready():
		cancel()
		<-done
		t.Fatal("a second agent started")
	case <-time.After(15 * time.Second):
		cancel()
		<-done
		t.Fatal("a second agent neither started nor stopped")
	}
	return nil
}

// partsHold reports whether every part of l reads back as fillParts wrote
// it for tenant.
func partsHold(ctx context.Context, t *testing.T, l api.Lease, tenant string) bool {
	t.Helper()
	for i, uri := range partURIs(l) {
		nc, err := nbd.DialURI(ctx, uri)
		if err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
		b := make([]byte, nc.Size())
		_, err = nc.ReadAtContext(ctx, b, 0)
		nc.Close()
		if err != nil {
			t.Fatalf("part %d: read: %v", i, err)
		}
		if !bytes.Equal(b, bytes.Repeat([]byte(tenant+" secret "), len(b)/len(tenant)+1)[:len(b)]) {
			return false
		}
	}
	return true
}

// TestBlockDeviceClaimedElsewhereRefused: a lock on a block device node
// (flock) is the node's, not the device's. An agent lending a real block
// device also claims the device itself (O_EXCL), so that a second agent
// naming it through another node (made with mknod elsewhere, another
// container's /dev), or lending the whole disk of a partition the first
// lends, is refused naming the device, not left to wipe the first's
// tenant's bytes under her live lease; and a device that is mounted is
// refused, naming the mount point, its file system untouched.
func TestBlockDeviceClaimedElsewhereRefused(t *testing.T) {
	t.Parallel()
	const dev = 8 << 20
	backing := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "backing.img")
		if err := os.WriteFile(p, make([]byte, dev), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// secondRefused runs a second agent, elsewhere, lending path while
	// the cluster's agent lends first to alice.
	secondRefused := func(t *testing.T, first, second string) {
		t.Helper()
		c := Start(t, Options{Nodes: 1, Tenants: []string{"alice"},
			Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: first}}})
		ctx := ctxT(t)
		alice := c.ClientWithToken(TenantToken("alice"))
		la, err := alice.CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeDedicated, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		fillParts(ctx, t, la, "alice")
		n := c.Nodes[0]
		cfg := n.cfg
		cfg.StateDir = filepath.Join(t.TempDir(), "elsewhere")
		cfg.Devices = []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: second}}
		err = refusedAgent(t, cfg)
		if !errors.Is(err, unix.EBUSY) {
			t.Fatalf("a second agent lending %s: %v, want EBUSY", second, err)
		}
		for _, want := range []string{"block device disk0 (" + second + ") is in use: mounted or claimed by another process"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal %q does not say %q", err, want)
			}
		}
		if got := c.Lease(la.ID); got.State != api.LeaseActive {
			t.Fatalf("alice's lease after the refused start: %s (%q)", got.State, got.Reason)
		}
		if !partsHold(ctx, t, la, "alice") {
			t.Fatal("alice's bytes changed under her lease")
		}
		// Once the first has stopped, the device is the second's (a
		// fresh state directory: it joins once the node is down).
		id := n.ID()
		n.Kill()
		n.cfg = cfg
		launchRefused(t, c, n, id)
	}

	t.Run("another device node", func(t *testing.T) {
		t.Parallel()
		d := loopdevtest.Attach(t, backing(t))
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			t.Fatal(err)
		}
		node := filepath.Join(t.TempDir(), "node")
		if err := unix.Mknod(node, unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
			t.Skipf("mknod %s: %v", node, err)
		}
		secondRefused(t, d, node)
	})
	t.Run("whole disk of a lent partition", func(t *testing.T) {
		t.Parallel()
		disk, part := partitionedLoop(t, backing(t))
		secondRefused(t, part, disk)
	})
	t.Run("partition of a lent whole disk", func(t *testing.T) {
		t.Parallel()
		disk, part := partitionedLoop(t, backing(t))
		secondRefused(t, disk, part)
	})
	t.Run("mounted", func(t *testing.T) {
		t.Parallel()
		d := loopdevtest.Attach(t, backing(t))
		mkfs, err := exec.LookPath("mkfs.ext4")
		if err != nil {
			t.Skip("mkfs.ext4 not installed")
		}
		if out, err := exec.Command(mkfs, "-q", d).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v: %s", err, out)
		}
		mnt := t.TempDir()
		if err := unix.Mount(d, mnt, "ext4", 0, ""); err != nil {
			t.Skipf("mount %s: %v", d, err)
		}
		defer func() {
			if err := unix.Unmount(mnt, 0); err != nil {
				t.Errorf("unmount %s: %v", mnt, err)
			}
		}()
		if err := os.WriteFile(filepath.Join(mnt, "data"), []byte("a file system's data"), 0o600); err != nil {
			t.Fatal(err)
		}
		c := Start(t, Options{Nodes: 1})
		cfg := c.Nodes[0].cfg
		cfg.StateDir = filepath.Join(t.TempDir(), "fresh") // would wipe the device
		cfg.Devices = []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: d}}
		err = refusedAgent(t, cfg)
		if !errors.Is(err, unix.EBUSY) {
			t.Fatalf("an agent lending the mounted %s: %v, want EBUSY", d, err)
		}
		for _, want := range []string{"block device disk0 (" + d + ") is in use: mounted or claimed by another process (mounted at " + mnt + ")"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal %q does not say %q", err, want)
			}
		}
		if b, err := os.ReadFile(filepath.Join(mnt, "data")); err != nil || string(b) != "a file system's data" {
			t.Fatalf("the file system's data after the refused start: %q (%v)", b, err)
		}
	})
}

// partitionedLoop writes an MBR with one partition (1 MiB on) into the
// file p, attaches it to a loop device with its partitions scanned, and
// returns the disk's and the partition's nodes; it skips the test where
// that is not possible.
func partitionedLoop(t *testing.T, p string) (disk, part string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	mbr := make([]byte, 512)
	e := mbr[446:462]
	e[4] = 0x83 // Linux
	binary.LittleEndian.PutUint32(e[8:], 2048)
	binary.LittleEndian.PutUint32(e[12:], uint32(fi.Size()/512-2048))
	mbr[510], mbr[511] = 0x55, 0xaa
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(mbr, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	disk = loopdevtest.Attach(t, p, "-P")
	// The partition scan is part of attaching (LOOP_CONFIGURE).
	name := filepath.Base(disk) + "p1"
	b, err := os.ReadFile(filepath.Join("/sys/class/block", name, "dev"))
	if err != nil {
		t.Skipf("the kernel found no partition on %s (no MBR partition support, CONFIG_MSDOS_PARTITION?): %v", disk, err)
	}
	var maj, min uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &maj, &min); err != nil {
		t.Fatalf("%s/dev: %q: %v", name, b, err)
	}
	// devtmpfs makes its node; a node of its own where it does not.
	part = filepath.Join("/dev", name)
	var st unix.Stat_t
	if unix.Stat(part, &st) != nil || st.Rdev != unix.Mkdev(maj, min) {
		part = filepath.Join(t.TempDir(), name)
		if err := unix.Mknod(part, unix.S_IFBLK|0o600, int(unix.Mkdev(maj, min))); err != nil {
			t.Skipf("mknod %s: %v", part, err)
		}
	}
	return disk, part
}
