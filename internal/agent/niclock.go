package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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

// One agent per lent NIC, too. Two agents lending one interface would each
// set up its lender (nftables table, policy routing) on it and share its
// bandwidth out twice, each undoing the other's configuration as it stops.
// A network interface is no file to flock, and its name means an interface
// only within a network namespace: two agents in two namespaces (two
// containers, the rack's hosts) may each lend their own "eth1". So the
// lock of a NIC is a Unix socket bound, in the agent's network namespace,
// to the abstract name "@rialto/nic/IFNAME" (nicLockName): one socket
// only can have a name, in one namespace, whatever file systems the
// agents see; the name goes when the socket is closed, which the kernel
// does when the process ends, however it ends. Run binds one per lent NIC
// after the block devices' locks, before anything opens a device, and
// holds them until it returns; a name another process (or another agent
// of this one) holds stops the start with ErrInUse, naming the NIC and,
// where /proc tells, the holder's PID. `ss -xap | grep rialto/nic` lists
// them with their processes.
//
// The name goes with the socket's last descriptor, though, not with the
// agent's: a child process that any goroutine of the process forked (an
// exec.Command) shares every descriptor until its exec closes its copies,
// tens of milliseconds on a loaded machine, and no call unbinds a name.
// So the socket also listens, and an agent that stops shuts it down
// (shutdown(2), which acts on the socket whoever shares it) before it
// closes it: a connection to the name is accepted (queued) while a
// running agent holds it, and refused once that agent has let go. A start
// that finds the name taken asks so: a lock that accepts is a running
// agent's, refused at once; one that refuses (let go and shared for a
// moment, or bound by a program that is no agent) is tried again for up
// to claimSettle before the start stops.

// nicLockName is the abstract socket name that locks the interface
// ifname.
func nicLockName(ifname string) string { return "@rialto/nic/" + ifname }

// lockNICs takes the lock of every configured NIC. Two devices on one
// interface are a configuration error.
func (a *Agent) lockNICs(ctx context.Context, l *instanceLocks) error {
	seen := map[string]string{}
	for _, d := range a.cfg.Devices {
		if d.Kind != api.KindNIC || d.Path == "" {
			continue
		}
		if o, dup := seen[d.Path]; dup {
			return fmt.Errorf("%w: NIC devices %q and %q are the same interface, %s", ErrConfig, o, d.Name, d.Path)
		}
		seen[d.Path] = d.Name
		name := nicLockName(d.Path)
		f, live, err := a.lockNIC(ctx, d.Name, name)
		if err != nil {
			switch {
			case errors.Is(err, unix.EADDRINUSE) && live:
				return fmt.Errorf("agent: NIC %s (%s) is %w%s: two agents lending one interface would each configure it and lend its bandwidth twice; stop that agent, or lend this one another interface (it holds the socket %s)",
					d.Name, d.Path, ErrInUse, filelock.HolderNote(abstractSocketHolder(name)), name)
			case errors.Is(err, unix.EADDRINUSE):
				return fmt.Errorf("agent: NIC %s (%s): the socket %s that locks it is still bound%s after %s, though no running agent holds it (a child process of an agent that stopped, not yet running its program, or a program that is no rialto agent): this agent does not configure the interface; start it again once that process has let go: %w",
					d.Name, d.Path, name, filelock.HolderNote(abstractSocketHolder(name)), claimSettle, err)
			}
			return fmt.Errorf("agent: NIC %s: lock %s: %w", d.Name, d.Path, err)
		}
		l.files = append(l.files, f)
	}
	return nil
}

// lockNIC binds the abstract name (of the NIC device) with bindAbstract.
// A name taken but not by a running agent (nicLockLive) may be a
// moment's: it is tried again for up to claimSettle, as
// claimBlockDevice's claim is. live says the last refusal's holder was a
// running agent's lock. The wait is real time, as the exec it waits for
// is.
func (a *Agent) lockNIC(ctx context.Context, device, name string) (f *os.File, live bool, err error) {
	b := backoff.Backoff{Min: 5 * time.Millisecond, Max: 100 * time.Millisecond}
	deadline := time.Now().Add(claimSettle)
	for tries := 0; ; tries++ {
		f, err = bindAbstract(name)
		if !errors.Is(err, unix.EADDRINUSE) {
			return f, false, err
		}
		if live = nicLockLive(name); live || time.Now().After(deadline) {
			return nil, live, err
		}
		if tries == 0 {
			a.log.Info("NIC lock let go but still bound, for now: trying again for a moment (the holder may be a child process of an agent that just stopped)",
				"device", device, "socket", name, "for", claimSettle)
		}
		if werr := b.Wait(ctx); werr != nil {
			return nil, false, err
		}
	}
}

// bindAbstract binds a new Unix socket to the abstract name (with its
// leading "@") and listens on it: an error wrapping EADDRINUSE if a
// socket of this network namespace has the name. Nothing accepts: a
// connection is only asked whether the lock is held (nicLockLive).
func bindAbstract(name string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", name, err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// nicLockLive reports whether the socket bound to the abstract name is a
// running agent's lock: it accepts a connection (queues it, or has its
// queue full). One shut down (by an agent that let it go: letGo), or
// that does not listen, refuses it.
func nicLockLive(name string) bool {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return true // cannot tell: as held
	}
	defer unix.Close(fd)
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: name})
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	return err == nil || errors.Is(err, unix.EAGAIN)
}

// abstractSocketHolder is the PID of a process with a descriptor of the
// Unix socket bound to the abstract name, as /proc tells it (0: unknown):
// the socket's inode from /proc/net/unix (this network namespace's), then
// the process whose descriptor links to it. The connections nicLockLive
// left queued on the socket have its name too, and no descriptor.
func abstractSocketHolder(name string) int {
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return 0
	}
	defer f.Close()
	// Num RefCount Protocol Flags Type St Inode Path
	want := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) == 8 && fl[7] == name {
			want["socket:["+fl[6]+"]"] = true
		}
	}
	if len(want) == 0 {
		return 0
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && want[l] {
				return pid
			}
		}
	}
	return 0
}
