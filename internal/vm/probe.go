package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ProbeTimeout bounds the KVM probe: a guest that has not exited by then
// counts as hung.
const ProbeTimeout = 5 * time.Second

// probeSector is a 512-byte boot sector: it writes "K" to the first serial
// port and exits qemu through isa-debug-exit with status (1<<1)|1 = 3.
func probeSector() []byte {
	code := []byte{
		0xb0, 'K', // mov al, 'K'
		0xba, 0xf8, 0x03, // mov dx, 0x3f8
		0xee,       // out dx, al
		0xb0, 0x01, // mov al, 1
		0xe6, 0xf4, // out 0xf4, al (isa-debug-exit)
		0xf4,       // hlt
		0xeb, 0xfd, // jmp back to hlt
	}
	s := make([]byte, 512)
	copy(s, code)
	s[510], s[511] = 0x55, 0xaa
	return s
}

// ProbeKVM boots a guest under KVM and reports whether it ran: a boot
// sector that prints "K" on the serial port and exits qemu, given
// ProbeTimeout. KVM may be there and still not work — with Debian's kernel
// nested KVM hangs the guest's first instructions on some hosts — which is
// why Run never picks KVM on the strength of /dev/kvm alone. The reason
// says why KVM was refused.
func ProbeKVM(ctx context.Context, qemu, dir string) (ok bool, reason string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("/dev/kvm: %v", err)
	}
	f.Close()
	img := filepath.Join(dir, fmt.Sprintf(".kvm-probe-%d.img", os.Getpid()))
	if err := os.WriteFile(img, probeSector(), 0o600); err != nil {
		return false, err.Error()
	}
	defer os.Remove(img)
	pctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(pctx, qemu, "-machine", "pc,accel=kvm", "-nodefaults", "-no-user-config", "-display", "none",
		"-serial", "stdio", "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
		"-drive", "file="+img+",format=raw,if=floppy", "-boot", "a")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case pctx.Err() != nil:
		return false, fmt.Sprintf("a KVM guest did not finish within %v (KVM hangs here)", ProbeTimeout)
	case errors.As(err, &ee) && ee.ExitCode() == 3 && strings.Contains(string(out), "K"):
		return true, ""
	default:
		return false, fmt.Sprintf("a KVM guest failed: %v: %s", err, strings.TrimSpace(string(out)))
	}
}

// probeRecord caches a probe's verdict for one kernel and qemu binary.
type probeRecord struct {
	Kernel  string    `json:"kernel"`
	QEMU    string    `json:"qemu"`
	QEMUMod time.Time `json:"qemu_modified"`
	KVM     bool      `json:"kvm"`
	Reason  string    `json:"reason,omitempty"`
	At      time.Time `json:"at"`
}

// ResolveAccel turns want (AccelAuto, AccelKVM or AccelTCG) into the
// accelerator to run with. AccelAuto probes KVM (ProbeKVM) and caches the
// verdict in dir/kvm-probe.json for this kernel and qemu binary, so a host
// where KVM hangs pays the probe's timeout once; an explicit choice is
// taken as given. The reason says why auto chose TCG.
func ResolveAccel(ctx context.Context, want, qemu, dir string) (accel, reason string, err error) {
	switch want {
	case AccelTCG, AccelKVM:
		return want, "", nil
	case AccelAuto, "":
	default:
		return "", "", fmt.Errorf("%w: accelerator %q, want auto, kvm or tcg", ErrConfig, want)
	}
	if qemu == "" {
		if qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return "", "", fmt.Errorf("%w: qemu-system-x86_64 not found (install qemu-system-x86)", ErrConfig)
		}
	}
	var uts syscall.Utsname
	_ = syscall.Uname(&uts)
	kernel := utsString(uts.Release[:])
	st, _ := os.Stat(qemu)
	var mod time.Time
	if st != nil {
		mod = st.ModTime().UTC()
	}
	cache := filepath.Join(dir, "kvm-probe.json")
	var rec probeRecord
	if b, err := os.ReadFile(cache); err == nil && json.Unmarshal(b, &rec) == nil &&
		rec.Kernel == kernel && rec.QEMU == qemu && rec.QEMUMod.Equal(mod) {
		return pick(rec.KVM), rec.Reason, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("vm: %w", err)
	}
	ok, why := ProbeKVM(ctx, qemu, dir)
	if ctx.Err() != nil {
		return "", "", ctx.Err()
	}
	rec = probeRecord{Kernel: kernel, QEMU: qemu, QEMUMod: mod, KVM: ok, Reason: why, At: time.Now().UTC()}
	if b, err := json.MarshalIndent(rec, "", "  "); err == nil {
		tmp := cache + ".tmp"
		if os.WriteFile(tmp, append(b, '\n'), 0o600) == nil {
			_ = os.Rename(tmp, cache)
		}
	}
	return pick(ok), why, nil
}

func pick(kvm bool) string {
	if kvm {
		return AccelKVM
	}
	return AccelTCG
}

func utsString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
