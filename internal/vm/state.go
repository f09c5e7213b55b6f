package vm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/rialto-project/rialto/internal/filelock"
)

// ErrNoVM is a VM name with no record in the state dir.
var ErrNoVM = errors.New("vm: no such VM")

// ErrInUse is a VM whose lock another supervisor holds (Lock).
var ErrInUse = errors.New("vm: in use")

// Record is what `rialto vm run` keeps about a VM in its state dir
// (STATE/NAME/vm.json, mode 0600): enough for `vm list`, `vm stop` and
// `vm move` to find it and start it again elsewhere. It holds no secret:
// the disk is named by its lease, fetched from the control plane by
// whoever starts the VM.
type Record struct {
	Name      string    `json:"name"`
	Host      string    `json:"host"`     // where it runs: "netns:NAME" in a named network namespace, else the hostname
	PID       int       `json:"pid"`      // the supervising `rialto vm run`
	QEMUPID   int       `json:"qemu_pid"` // qemu
	Lease     string    `json:"lease"`    // the block lease that is its disk
	Parts     int       `json:"parts"`    // the lease's parts
	Disk      string    `json:"disk"`     // how qemu reaches the disk (no credential)
	Kernel    string    `json:"kernel"`
	Initrd    string    `json:"initrd,omitempty"`
	Append    string    `json:"append,omitempty"`
	MemoryMiB int64     `json:"memory_mib"`
	CPUs      int       `json:"cpus"`
	Accel     string    `json:"accel"`           // tcg or kvm, as resolved
	AccelWant string    `json:"accel_requested"` // auto, tcg or kvm, as asked
	Addr      string    `json:"control_plane"`   // where the lease was fetched
	QMP       string    `json:"qmp"`
	Console   string    `json:"console"`
	Started   time.Time `json:"started"`
	// CACertificates are the SHA-256 fingerprints (hex, as `rialto ca
	// show` prints them) of the CA certificates the supervisor verifies
	// the control plane and the disk's lenders with: those of --cacert,
	// or the control plane's since a CA rotation (the record is saved
	// again when they change).
	CACertificates []string `json:"ca_certificates,omitempty"`
}

// VMDir is a VM's directory in a state dir.
func VMDir(stateDir, name string) (string, error) {
	if !validName(name) {
		return "", fmt.Errorf("%w: name %q", ErrConfig, name)
	}
	return filepath.Join(stateDir, name), nil
}

const (
	recordFile = "vm.json"
	lockFile   = "lock"
)

// Lock takes the VM's lock, STATE/NAME/lock: the supervisor (`rialto vm
// run`) holds it for as long as it runs, so that two supervisors never run
// one VM (one disk under two guests, one QMP socket path), and whatever a
// killed supervisor left in the directory (its composed disk's socket) is
// known to be nobody's once the lock is taken. The kernel releases it when
// the holder exits, however it exits; filelock.Close releases it too (the
// file's Close alone leaves it with a child process forked meanwhile,
// until its exec). A lock held by another process is ErrInUse, naming it.
func Lock(stateDir, name string) (*os.File, error) {
	dir, err := VMDir(stateDir, name)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	p := filepath.Join(dir, lockFile)
	f, err := filelock.Open(p)
	var held *filelock.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("%w: VM %s is supervised by another `rialto vm run`%s; `rialto vm stop %s` first", ErrInUse, name, filelock.HolderNote(held.PID), name)
	}
	if err != nil {
		return nil, fmt.Errorf("vm: lock %s: %w", p, err)
	}
	return f, nil
}

// SaveRecord writes r into its VM's directory (atomically, mode 0600).
func SaveRecord(stateDir string, r Record) error {
	dir, err := VMDir(stateDir, r.Name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, recordFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, recordFile))
}

// LoadRecord reads a VM's record; ErrNoVM if there is none.
func LoadRecord(stateDir, name string) (Record, error) {
	dir, err := VMDir(stateDir, name)
	if err != nil {
		return Record{}, err
	}
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, fmt.Errorf("%w: %s (no record in %s)", ErrNoVM, name, stateDir)
	}
	if err != nil {
		return Record{}, fmt.Errorf("vm: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("vm: %s: %w", filepath.Join(dir, recordFile), err)
	}
	return r, nil
}

// RemoveRecord removes a VM's record (its console log stays).
func RemoveRecord(stateDir, name string) error {
	dir, err := VMDir(stateDir, name)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, recordFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("vm: %w", err)
	}
	return nil
}

// ListRecords returns the records of a state dir, by name.
func ListRecords(stateDir string) ([]Record, error) {
	ents, err := os.ReadDir(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	var out []Record
	for _, e := range ents {
		if !e.IsDir() || !validName(e.Name()) {
			continue
		}
		r, err := LoadRecord(stateDir, e.Name())
		if errors.Is(err, ErrNoVM) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Alive reports whether pid names a running process (not a zombie).
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' {
			return i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
		}
	}
	return true
}

// Supervising reports whether r's supervisor (a `rialto vm run`) runs:
// its pid is alive and names such a process (not a reused pid).
func (r Record) Supervising() bool {
	return r.PID > 0 && Alive(r.PID) && cmdlineHas(r.PID, "\x00vm\x00run\x00")
}

// QEMURunning reports whether r's qemu runs (its pid is alive and is this
// VM's qemu).
func (r Record) QEMURunning() bool {
	return r.QEMUPID > 0 && Alive(r.QEMUPID) && cmdlineHas(r.QEMUPID, "\x00guest="+r.Name+"\x00")
}

// Running reports whether anything of r runs.
func (r Record) Running() bool { return r.Supervising() || r.QEMURunning() }

func cmdlineHas(pid int, s string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains("\x00"+string(b), s)
}

// HostName names where this process runs, for a Record: "netns:NAME" when
// its network namespace is one of ip-netns(8)'s named ones, else the
// hostname.
func HostName() string {
	var self syscall.Stat_t
	if syscall.Stat("/proc/self/ns/net", &self) == nil {
		if ents, err := os.ReadDir("/run/netns"); err == nil {
			for _, e := range ents {
				var st syscall.Stat_t
				if syscall.Stat(filepath.Join("/run/netns", e.Name()), &st) == nil && st.Ino == self.Ino && st.Dev == self.Dev {
					return "netns:" + e.Name()
				}
			}
		}
	}
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}
