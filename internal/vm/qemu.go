package vm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// Accelerators qemu can run a guest with.
const (
	AccelTCG  = "tcg"  // the portable emulator: always works, slower
	AccelKVM  = "kvm"  // hardware virtualisation: needs a working /dev/kvm
	AccelAuto = "auto" // KVM if the probe (ProbeKVM) boots a guest under it, else TCG
)

// ErrConfig is a VM configuration that cannot run.
var ErrConfig = errors.New("vm: bad config")

// Config is one VM: what qemu boots, and the disk it boots with.
type Config struct {
	// Name names the VM in its state dir: letters, digits, "-", "_" and
	// "." (not first).
	Name string
	// Dir is the VM's own directory (state, QMP socket, console log).
	Dir string
	// Kernel, Initrd and Append are qemu's -kernel, -initrd and -append
	// (direct kernel boot). Initrd may be empty.
	Kernel, Initrd, Append string
	// MemoryMiB is the guest's memory (qemu -m), 0: 256.
	MemoryMiB int64
	// CPUs is the guest's vCPU count, 0: 1.
	CPUs int
	// Accel is AccelTCG or AccelKVM (resolve AccelAuto with ProbeKVM
	// first).
	Accel string
	// Disk is the NBD export the guest's virtio disk is: a local
	// attachment's, on a Unix socket (the lease served by `rialto
	// attach`'s code, which dials the lenders). Its export name is a
	// secret: it is given to qemu over QMP, never on the command line,
	// and redacted from qemu's error messages.
	Disk nbd.URI
	// QEMU is the qemu-system-x86_64 binary; empty: found on PATH.
	QEMU string
}

// Files of a VM's directory.
const (
	QMPSocket  = "qmp.sock"
	ConsoleLog = "console.log"
)

// validName reports whether s can name a VM (and a directory).
func validName(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '.' {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// check validates c and fills in defaults.
func (c *Config) check() error {
	if !validName(c.Name) {
		return fmt.Errorf("%w: name %q: use letters, digits, -, _ and . (not first), at most 64", ErrConfig, c.Name)
	}
	if c.Dir == "" {
		return fmt.Errorf("%w: no directory", ErrConfig)
	}
	if len(filepath.Join(c.Dir, QMPSocket)) >= 104 {
		return fmt.Errorf("%w: the state dir %s is too long for a Unix socket path; use a shorter --state-dir", ErrConfig, c.Dir)
	}
	if c.Kernel == "" {
		return fmt.Errorf("%w: no kernel", ErrConfig)
	}
	for _, f := range []string{c.Kernel, c.Initrd} {
		if f == "" {
			continue
		}
		if st, err := os.Stat(f); err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("%w: %s is not a readable file", ErrConfig, f)
		}
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 256
	}
	if c.MemoryMiB < 16 || c.MemoryMiB > 1<<20 {
		return fmt.Errorf("%w: memory %d MiB, want 16 MiB..1 TiB", ErrConfig, c.MemoryMiB)
	}
	if c.CPUs == 0 {
		c.CPUs = 1
	}
	if c.CPUs < 1 || c.CPUs > 64 {
		return fmt.Errorf("%w: %d vCPUs, want 1..64", ErrConfig, c.CPUs)
	}
	if c.Accel != AccelTCG && c.Accel != AccelKVM {
		return fmt.Errorf("%w: accelerator %q, want tcg or kvm", ErrConfig, c.Accel)
	}
	switch {
	case c.Disk.Network == "":
		return fmt.Errorf("%w: no disk", ErrConfig)
	case c.Disk.Network != "unix" || c.Disk.TLS:
		return fmt.Errorf("%w: the disk is %s: want a local attachment's Unix socket (borrower.Attach)", ErrConfig, c.Disk.Network+":"+c.Disk.Address)
	}
	if strings.ContainsAny(c.Append, "\n") {
		return fmt.Errorf("%w: the kernel command line has a newline", ErrConfig)
	}
	return nil
}

// Args is qemu's command line for c, without the disk: the guest starts
// paused (-S) and Run adds the disk over QMP, so that the export name (a
// credential) never shows in `ps`. The console (first serial port) is
// appended to Dir/console.log.
func (c *Config) Args() []string {
	a := []string{
		"-name", "guest=" + c.Name,
		"-machine", "pc,accel=" + c.Accel,
		"-m", strconv.FormatInt(c.MemoryMiB, 10),
		"-smp", strconv.Itoa(c.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-chardev", "file,id=console,path=" + optEscape(filepath.Join(c.Dir, ConsoleLog)) + ",append=on",
		"-serial", "chardev:console",
		"-qmp", "unix:" + optEscape(filepath.Join(c.Dir, QMPSocket)) + ",server=on,wait=off",
		"-kernel", c.Kernel,
	}
	if c.Accel == AccelKVM {
		a = append(a, "-cpu", "host")
	}
	if c.Initrd != "" {
		a = append(a, "-initrd", c.Initrd)
	}
	if c.Append != "" {
		a = append(a, "-append", c.Append)
	}
	return append(a, "-S")
}

// optEscape escapes a value inside a qemu option list (commas double).
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// blockdev is the QMP blockdev-add argument of the disk: qemu's NBD
// client on the attachment's Unix socket.
func (c *Config) blockdev() map[string]any {
	return map[string]any{"driver": "nbd", "node-name": "disk0", "server": map[string]any{"type": "unix", "path": c.Disk.Address},
		"export": c.Disk.Export, "discard": "unmap"}
}
