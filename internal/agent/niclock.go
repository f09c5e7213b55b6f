package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/api"
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

// nicLockName is the abstract socket name that locks the interface
// ifname.
func nicLockName(ifname string) string { return "@rialto/nic/" + ifname }

// lockNICs takes the lock of every configured NIC. Two devices on one
// interface are a configuration error.
func (a *Agent) lockNICs(l *instanceLocks) error {
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
		f, err := bindAbstract(name)
		if err != nil {
			if errors.Is(err, unix.EADDRINUSE) {
				return fmt.Errorf("agent: NIC %s (%s) is %w%s: two agents lending one interface would each configure it and lend its bandwidth twice; stop that agent, or lend this one another interface (it holds the socket %s)",
					d.Name, d.Path, ErrInUse, filelock.HolderNote(abstractSocketHolder(name)), name)
			}
			return fmt.Errorf("agent: NIC %s: lock %s: %w", d.Name, d.Path, err)
		}
		l.files = append(l.files, f)
	}
	return nil
}

// bindAbstract binds a new Unix socket to the abstract name (with its
// leading "@"): an error wrapping EADDRINUSE if a socket of this network
// namespace has it.
func bindAbstract(name string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// abstractSocketHolder is the PID of a process with a descriptor of the
// Unix socket bound to the abstract name, as /proc tells it (0: unknown):
// the socket's inode from /proc/net/unix (this network namespace's), then
// the process whose descriptor links to it.
func abstractSocketHolder(name string) int {
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return 0
	}
	defer f.Close()
	// Num RefCount Protocol Flags Type St Inode Path
	var inode string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) == 8 && fl[7] == name {
			inode = fl[6]
			break
		}
	}
	if inode == "" {
		return 0
	}
	want := "socket:[" + inode + "]"
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
			if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && l == want {
				return pid
			}
		}
	}
	return 0
}
