package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/filelock"
)

// One agent per state directory, and one per block device. A second agent
// on the same state directory would overwrite the first's identity,
// exports and wipe journal; one on the same block device (the same machine
// started again from another working directory, so with a fresh state
// directory, or another configuration naming the same file) would take
// the first's tenants' ranges for lost state and wipe them in full under
// their live leases (fresh.go), or lend them again. So an agent takes, in
// Run, before it reads its state or opens, wipes or serves a device, an
// exclusive flock(2) on a lock file in its state directory and on every
// block device it lends (the file, or the device node, itself), and holds
// them until Run returns. A lock another process (or another agent of this
// process: flock locks belong to open file descriptions) holds stops the
// start with ErrInUse, naming the path and, where /proc/locks tells, the
// holder's PID. The kernel drops a process's locks when it exits, however
// it ends (SIGKILL too): an agent started after the last one ended starts
// as usual.
//
// A lock is on the inode: another path to the same file (a symlink, a hard
// link, a bind mount) is the same lock, but two device nodes of one block
// device (a node made elsewhere, another container's /dev) are two, and a
// partition is not its whole disk. So a block device node (not a regular
// file) is also opened with O_EXCL, and that descriptor kept as long as the
// locks: the kernel's exclusive claim is on the device, whatever node
// names it, and covers a partition and its whole disk; it also refuses a
// device that is mounted or otherwise claimed (claimBlockDevice). The flock
// comes first, so that another agent on the same node is named with its
// PID.

// ErrInUse is the error of a start whose state directory or block device
// another rialto agent holds.
var ErrInUse = errors.New("in use by another rialto agent")

// lockFile is the state directory's lock; it holds the PID of the agent
// that locked it last.
const lockFile = "agent.lock"

// instanceLocks are the locks an agent holds while it runs: the
// descriptors whose open file descriptions hold them.
type instanceLocks struct {
	files []*os.File
}

// release lets go of the locks and closes the descriptors. A flock is
// the open file description's, and a child process forked meanwhile (by
// any goroutine of the process: an exec.Command) shares that description
// until its exec closes its copy of the descriptor: closing ours alone
// left the lock held while it did, and an agent started right after this
// one returned (a restart within the process) was refused as if another
// agent ran. letGo drops each lock whoever else shares its description.
// (A block device's O_EXCL claim has no such call: it goes with the last
// descriptor; claimBlockDevice waits for a moment for it.)
func (l *instanceLocks) release() {
	for _, f := range l.files {
		letGo(f)
		f.Close()
	}
	l.files = nil
}

// letGo lets go of the lock f holds, however many descriptors share its
// open file description: a flock is unlocked (LOCK_UN); a NIC's socket,
// whose name only its last descriptor's close unbinds, is shut down,
// which tells the next agent that it may have the name in a moment
// (niclock.go). On a block device's claim it does nothing.
func letGo(f *os.File) {
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
		_ = unix.Shutdown(fd, unix.SHUT_RDWR)
		return
	}
	_ = filelock.Unlock(f) // none on a claim: a no-op
}

// lockStateDir locks the state directory (its lock file, created if
// absent) and writes this process's PID into the file.
func (a *Agent) lockStateDir(l *instanceLocks) error {
	p := filepath.Join(a.cfg.StateDir, lockFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("agent: lock the state directory: %w", err)
	}
	if err := filelock.TryLock(f); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			pid, _ := filelock.Holder(f)
			if pid == 0 {
				pid = pidInFile(f)
			}
			return fmt.Errorf("agent: state directory %s is %w%s: two agents on one state directory would overwrite each other's identity, exports and wipe journal; stop that agent first (it holds %s)",
				a.cfg.StateDir, ErrInUse, filelock.HolderNote(pid), p)
		}
		return fmt.Errorf("agent: lock %s: %w", p, err)
	}
	l.files = append(l.files, f)
	// For the operator (and the message of an agent refused): the lock
	// itself is what counts.
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		a.log.Warn("could not write the PID into the state directory's lock file (the lock is held)", "file", p, "err", err)
	}
	return nil
}

// lockBlockDevices opens every configured block device's file (creating
// a missing one, empty, as BlockDriver.Open would) and locks it. It
// returns the paths (relative ones resolved in the state directory) of
// those whose files existed before: they may hold tenants' bytes
// (fresh.go). Two devices on one file are a configuration error.
func (a *Agent) lockBlockDevices(ctx context.Context, l *instanceLocks) (existed map[string]bool, err error) {
	existed = map[string]bool{}
	type opened struct {
		name     string
		dev, ino uint64
	}
	var seen []opened
	for _, d := range a.cfg.Devices {
		if d.Kind != api.KindBlock {
			continue
		}
		p := d.Path
		if !filepath.IsAbs(p) {
			p = filepath.Join(a.cfg.StateDir, p)
		}
		f, created, err := openDeviceFile(p)
		if err != nil {
			return nil, fmt.Errorf("agent: device %s: %w", d.Name, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return nil, fmt.Errorf("agent: device %s: stat %s: %w", d.Name, p, err)
		}
		for _, o := range seen {
			if o.dev == st.Dev && o.ino == st.Ino {
				f.Close()
				return nil, fmt.Errorf("%w: block devices %q and %q are the same file, %s", ErrConfig, o.name, d.Name, p)
			}
		}
		seen = append(seen, opened{name: d.Name, dev: st.Dev, ino: st.Ino})
		if err := filelock.TryLock(f); err != nil {
			defer f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				pid, shared := filelock.Holder(f)
				if shared {
					return nil, fmt.Errorf("agent: block device %s (%s) is locked by another program%s, with a shared lock, which no rialto agent takes (udev probing the disk, a tool working on it): this agent neither reads, wipes nor serves it; start it again once that is done: %w",
						d.Name, p, filelock.HolderNote(pid), err)
				}
				return nil, fmt.Errorf("agent: block device %s (%s) is %w%s: this agent neither reads, wipes nor serves it; stop that agent, or lend this one other devices",
					d.Name, p, ErrInUse, filelock.HolderNote(pid))
			}
			return nil, fmt.Errorf("agent: device %s: lock %s: %w", d.Name, p, err)
		}
		l.files = append(l.files, f)
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			x, note, err := a.claimBlockDevice(ctx, d.Name, p, st.Rdev)
			if err != nil {
				if errors.Is(err, unix.EBUSY) {
					if note == "" {
						note = " (a file system, swap, LVM or RAID, a partition of it or its whole disk, another rialto agent through another device node)"
					}
					return nil, fmt.Errorf("agent: block device %s (%s) is in use: mounted or claimed by another process%s: this agent neither reads, wipes nor serves it: %w",
						d.Name, p, note, err)
				}
				return nil, fmt.Errorf("agent: device %s: claim %s: %w", d.Name, p, err)
			}
			l.files = append(l.files, x)
		}
		if !created {
			existed[p] = true
		}
	}
	return existed, nil
}

// claimBlockDevice claims the block device node p (device name, of
// device number rdev) with claimOnce. A claim that mountinfo and sysfs do
// not explain (note: blockBusyNote) may be a moment's: the claim goes with
// the last descriptor of its open file description, and a child process
// that the holder forked (an exec.Command of any goroutine) keeps a copy
// of every descriptor until its exec closes it — for tens of
// milliseconds on a loaded machine. So the agent that held the device
// before this one, in this process (a restart within it) or in the
// process that just ended, may still hold it for a moment: such a claim
// is tried again for up to claimSettle before the device is refused.
// The wait is real time, as the exec it waits for is.
func (a *Agent) claimBlockDevice(ctx context.Context, name, p string, rdev uint64) (f *os.File, note string, err error) {
	b := backoff.Backoff{Min: 5 * time.Millisecond, Max: 100 * time.Millisecond}
	deadline := time.Now().Add(claimSettle)
	for tries := 0; ; tries++ {
		f, err = claimOnce(p)
		if !errors.Is(err, unix.EBUSY) {
			return f, "", err
		}
		if note = blockBusyNote(rdev); note != "" || time.Now().After(deadline) {
			return nil, note, err
		}
		if tries == 0 {
			a.log.Info("block device claimed by another, for now: trying again for a moment (the holder may be a process that just stopped, or its child)",
				"device", name, "path", p, "for", claimSettle)
		}
		if werr := b.Wait(ctx); werr != nil {
			return nil, "", err
		}
	}
}

// claimSettle is how long claimBlockDevice tries again a claim held by
// another that nothing it can see explains.
const claimSettle = 2 * time.Second

// claimOnce opens the block device node p with O_EXCL, Linux's exclusive
// claim of the device itself, whatever node names it: it fails with EBUSY
// if the device is mounted, is swap, is held by a device mapper, MD or
// loop stack, is claimed by another exclusive opener (another agent,
// through any node of it), or is a partition of a claimed whole disk or
// the whole disk of a claimed partition. The claim lasts until the
// descriptor is closed; other opens (the agent's own, without O_EXCL) are
// not affected.
func claimOnce(p string) (*os.File, error) {
	for {
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_EXCL, 0)
		if !errors.Is(err, unix.EINTR) {
			return f, err
		}
	}
}

// blockBusyNote says, as far as /proc/self/mountinfo and sysfs tell, what
// holds the block device rdev: " (mounted at M)", " (its partition P is
// mounted at M)", " (held by H)", or "".
func blockBusyNote(rdev uint64) string {
	majmin := fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))
	sys := "/sys/dev/block/" + majmin
	// The device and its partitions (a whole disk's directory has one
	// per partition, with its dev file).
	devs := map[string]string{majmin: ""}
	if ents, err := os.ReadDir(sys); err == nil {
		for _, e := range ents {
			if b, err := os.ReadFile(filepath.Join(sys, e.Name(), "partition")); err != nil || len(b) == 0 {
				continue
			}
			if b, err := os.ReadFile(filepath.Join(sys, e.Name(), "dev")); err == nil {
				devs[strings.TrimSpace(string(b))] = e.Name()
			}
		}
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// ID PARENT MAJ:MIN ROOT MOUNTPOINT ...
			fl := strings.Fields(sc.Text())
			if len(fl) < 5 {
				continue
			}
			part, ok := devs[fl[2]]
			if !ok {
				continue
			}
			if part != "" {
				return fmt.Sprintf(" (its partition %s is mounted at %s)", part, fl[4])
			}
			return fmt.Sprintf(" (mounted at %s)", fl[4])
		}
	}
	if ents, err := os.ReadDir(filepath.Join(sys, "holders")); err == nil && len(ents) > 0 {
		var hs []string
		for _, e := range ents {
			hs = append(hs, e.Name())
		}
		return fmt.Sprintf(" (held by %s)", strings.Join(hs, ", "))
	}
	return ""
}

// openDeviceFile opens a block device's file read-write, creating it
// (with its directory) if it does not exist; created says it did not.
func openDeviceFile(p string) (f *os.File, created bool, err error) {
	f, err = os.OpenFile(p, os.O_RDWR, 0)
	if err == nil {
		return f, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return nil, false, err
	}
	f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	return f, err == nil, err
}

// pidInFile is the PID the state directory's lock file holds (0: none).
func pidInFile(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
