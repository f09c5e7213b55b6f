package vmtest

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// MarkerOffset is where the guest keeps its marker on its disk.
const MarkerOffset = 1 << 20

// Console lines the guest prints (each followed by a space and the marker
// value, but for Idle).
const (
	Wrote = "RIALTO-WROTE"
	Found = "RIALTO-FOUND"
	Idle  = "RIALTO-IDLE"
	// Read is printed once idle, about every second, by a guest booted
	// with AppendReads: each time it reads the marker from its disk
	// anew, past its page cache (O_DIRECT), so that the line shows the
	// disk still answers; followed by what it read (empty when the read
	// failed).
	Read = "RIALTO-READ"
	// RW is printed once idle, about every second, by a guest booted
	// with AppendWrites: each time it writes a sequence number N to the
	// sector after its marker's and reads both back past its page cache
	// (O_DIRECT both ways), printing "RIALTO-RW N MARKER M" where M is
	// the number read back (M is N when the write and the reads got
	// through; a failed read leaves MARKER or M empty).
	RW = "RIALTO-RW"
)

// Guest is a kernel and an initramfs to boot it with.
type Guest struct {
	Kernel  string // PVH-bootable vmlinux when it could be extracted, else the bzImage
	Initrd  string
	Release string // the kernel's release, e.g. 6.1.0-56-amd64
}

// Append is a kernel command line for the guest with the given marker.
// no_timer_check: under TCG on a loaded host the kernel's check of the
// IO-APIC timer can miss its ticks and panic the boot ("IO-APIC + timer
// doesn't work"), seen once in a test run.
func Append(marker string) string {
	return "console=ttyS0 quiet panic=-1 no_timer_check rialto.marker=" + marker
}

// AppendReads is Append, and the guest keeps reading its marker from
// its disk once idle (Read).
func AppendReads(marker string) string { return Append(marker) + " rialto.reads=1" }

// AppendWrites is Append, and the guest keeps writing to its disk and
// reading back once idle (RW).
func AppendWrites(marker string) string { return Append(marker) + " rialto.writes=1" }

// RWLine parses a console line of RW: the number written, the marker
// and the number read back; ok is false for another line.
func RWLine(line string) (wrote int, marker string, read int, ok bool) {
	f := strings.Fields(strings.TrimRight(line, "\r"))
	if len(f) != 4 || f[0] != RW {
		return 0, "", 0, false
	}
	w, err1 := strconv.Atoi(f[1])
	r, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil {
		return 0, "", 0, false
	}
	return w, f[2], r, true
}

var (
	once   sync.Once
	guest  Guest
	reason string
)

// Find returns the test guest, or skips t saying what is missing
// (install linux-image-amd64 and busybox-static).
func Find(t testing.TB) Guest {
	t.Helper()
	once.Do(func() { guest, reason = build() })
	if reason != "" {
		t.Skip("vmtest: " + reason)
	}
	return guest
}

func build() (Guest, string) {
	bz, release := kernel()
	if bz == "" {
		return Guest{}, "no kernel with modules in /boot and /lib/modules (install linux-image-amd64)"
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return Guest{}, "busybox not installed (install busybox-static)"
	}
	if f, err := elf.Open(busybox); err != nil {
		return Guest{}, "busybox: " + err.Error()
	} else {
		dynamic := false
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				dynamic = true
			}
		}
		f.Close()
		if dynamic {
			return Guest{}, busybox + " is linked dynamically (install busybox-static)"
		}
	}
	mods, err := modules(release, "virtio_pci", "virtio_blk")
	if err != nil {
		return Guest{}, err.Error()
	}
	// One file per kernel, user and /init in the temp dir, rebuilt by
	// every test process (written aside, then renamed: a concurrent
	// reader sees a whole archive); test processes of another /init
	// (another checkout) write another file.
	script := sha256.Sum256([]byte(initScript))
	g := Guest{Kernel: pvh(bz, release), Release: release,
		Initrd: filepath.Join(os.TempDir(), fmt.Sprintf("rialto-vmtest-initramfs-%s-%d-%x.cpio", release, os.Getuid(), script[:4]))}
	tmp := fmt.Sprintf("%s.%d.tmp", g.Initrd, time.Now().UnixNano())
	if err := initramfs(tmp, busybox, mods); err != nil {
		os.Remove(tmp)
		return Guest{}, "initramfs: " + err.Error()
	}
	if err := os.Rename(tmp, g.Initrd); err != nil {
		os.Remove(tmp)
		return Guest{}, "initramfs: " + err.Error()
	}
	return g, ""
}

// kernel finds the newest /boot/vmlinuz-RELEASE whose modules are in
// /lib/modules/RELEASE.
func kernel() (path, release string) {
	ks, _ := filepath.Glob("/boot/vmlinuz-*")
	sort.Strings(ks)
	for i := len(ks) - 1; i >= 0; i-- {
		r := strings.TrimPrefix(filepath.Base(ks[i]), "vmlinuz-")
		if _, err := os.Stat(filepath.Join("/lib/modules", r, "modules.dep")); err == nil {
			return ks[i], r
		}
	}
	return "", ""
}

// modules returns the module files to load, in order, for the wanted
// modules and what they depend on (modules.dep); built-in ones need none.
func modules(release string, want ...string) ([]string, error) {
	base := filepath.Join("/lib/modules", release)
	builtin, _ := os.ReadFile(filepath.Join(base, "modules.builtin"))
	depf, err := os.ReadFile(filepath.Join(base, "modules.dep"))
	if err != nil {
		return nil, err
	}
	deps := map[string][]string{} // module name → its file and its dependencies' files
	files := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(depf))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		mod, ds, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		name := modName(mod)
		files[name] = mod
		deps[name] = strings.Fields(ds)
	}
	var order []string
	seen := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		if seen[name] {
			return nil
		}
		seen[name] = true
		f, ok := files[name]
		if !ok {
			if bytes.Contains(builtin, []byte("/"+name+".ko")) {
				return nil
			}
			return fmt.Errorf("module %s is neither in modules.dep nor built in (kernel %s)", name, release)
		}
		for _, d := range deps[name] {
			if err := visit(modName(d)); err != nil {
				return err
			}
		}
		if strings.HasSuffix(f, ".ko.zst") {
			return fmt.Errorf("module %s is zstd-compressed; busybox insmod cannot load it", name)
		}
		order = append(order, filepath.Join(base, f))
		return nil
	}
	for _, w := range want {
		if err := visit(w); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func modName(path string) string {
	b := filepath.Base(path)
	for _, ext := range []string{".ko.xz", ".ko.zst", ".ko.gz", ".ko"} {
		b = strings.TrimSuffix(b, ext)
	}
	return strings.ReplaceAll(b, "-", "_")
}

// pvh extracts the uncompressed kernel (an ELF qemu boots through PVH,
// skipping the real-mode setup and the decompression, which under TCG take
// most of the boot) from an xz-compressed bzImage into a cache in the temp
// dir, and returns it; the bzImage itself when that fails.
func pvh(bz, release string) string {
	out := filepath.Join(os.TempDir(), fmt.Sprintf("rialto-vmtest-vmlinux-%s-%d", release, os.Getuid()))
	if st, err := os.Stat(out); err == nil && st.Size() > 0 {
		if f, err := elf.Open(out); err == nil {
			f.Close()
			return out
		}
	}
	img, err := os.ReadFile(bz)
	if err != nil {
		return bz
	}
	i := bytes.Index(img, []byte{0xfd, '7', 'z', 'X', 'Z', 0})
	if i < 0 {
		return bz
	}
	xz, err := exec.LookPath("xz")
	if err != nil {
		return bz
	}
	tmp := fmt.Sprintf("%s.%d.tmp", out, time.Now().UnixNano())
	f, err := os.Create(tmp)
	if err != nil {
		return bz
	}
	cmd := exec.Command(xz, "-dc", "--single-stream")
	cmd.Stdin, cmd.Stdout = bytes.NewReader(img[i:]), f
	err = cmd.Run()
	f.Close()
	if err == nil {
		var ef *elf.File
		if ef, err = elf.Open(tmp); err == nil {
			ef.Close()
			err = os.Rename(tmp, out)
		}
	}
	if err != nil {
		os.Remove(tmp)
		return bz
	}
	return out
}

// initScript is the guest's /init.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m || echo "RIALTO-ERROR insmod $m"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
m=$(sed -n 's/.*rialto\.marker=\([^ ]*\).*/\1/p' /proc/cmdline)
got=$(dd if=/dev/vda bs=512 skip=2048 count=1 2>/dev/null | tr -d '\000')
case "$got" in
RIALTO-MARKER:*) echo "RIALTO-FOUND ${got#RIALTO-MARKER:}" ;;
*) printf 'RIALTO-MARKER:%s' "$m" | dd of=/dev/vda bs=512 seek=2048 conv=sync,fsync 2>/dev/null && sync && echo "RIALTO-WROTE $m" ;;
esac
echo RIALTO-IDLE
case " $(cat /proc/cmdline) " in
*" rialto.reads=1 "*)
	while true; do
		got=$(dd if=/dev/vda bs=512 skip=2048 count=1 iflag=direct 2>/dev/null | tr -d '\000')
		echo "RIALTO-READ ${got#RIALTO-MARKER:}"
		sleep 1
	done ;;
*" rialto.writes=1 "*)
	n=0
	while true; do
		n=$((n+1))
		printf 'RIALTO-TICK:%s' "$n" | dd of=/dev/vda bs=512 seek=2049 count=1 conv=sync,fsync oflag=direct 2>/dev/null
		got=$(dd if=/dev/vda bs=512 skip=2048 count=1 iflag=direct 2>/dev/null | tr -d '\000')
		tick=$(dd if=/dev/vda bs=512 skip=2049 count=1 iflag=direct 2>/dev/null | tr -d '\000')
		echo "RIALTO-RW $n ${got#RIALTO-MARKER:} ${tick#RIALTO-TICK:}"
		sleep 1
	done ;;
esac
while true; do sleep 3600; done
`

// initramfs writes a newc cpio archive with busybox, /init and the modules.
func initramfs(path, busybox string, mods []string) error {
	var w cpioWriter
	for _, d := range []string{"bin", "dev", "proc", "sys", "lib", "lib/modules"} {
		w.add(d, 0o040755, nil, 0, 0)
	}
	w.add("dev/console", 0o020600, nil, 5, 1)
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	w.add("bin/busybox", 0o100755, bb, 0, 0)
	w.add("init", 0o100755, []byte(initScript), 0, 0)
	var order []string
	for _, m := range mods {
		b, err := os.ReadFile(m)
		if err != nil {
			return err
		}
		name := filepath.Base(m)
		if strings.HasSuffix(name, ".xz") {
			out, err := exec.Command("xz", "-dc", m).Output()
			if err != nil {
				return fmt.Errorf("decompress %s: %w", m, err)
			}
			b, name = out, strings.TrimSuffix(name, ".xz")
		}
		w.add("lib/modules/"+name, 0o100644, b, 0, 0)
		order = append(order, name)
	}
	w.add("lib/modules/order", 0o100644, []byte(strings.Join(order, "\n")+"\n"), 0, 0)
	return os.WriteFile(path, w.finish(), 0o644)
}

// cpioWriter writes the "newc" cpio format the kernel unpacks.
type cpioWriter struct {
	b   bytes.Buffer
	ino int
}

func (w *cpioWriter) add(name string, mode int, data []byte, rmajor, rminor int) {
	w.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	fmt.Fprintf(&w.b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		w.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	w.b.WriteString(name)
	w.b.WriteByte(0)
	w.pad()
	w.b.Write(data)
	w.pad()
}

func (w *cpioWriter) pad() {
	for w.b.Len()%4 != 0 {
		w.b.WriteByte(0)
	}
}

func (w *cpioWriter) finish() []byte {
	w.add("TRAILER!!!", 0, nil, 0, 0)
	return w.b.Bytes()
}

// WaitConsole waits until the console log at path has a whole line starting
// with prefix and returns that line, or fails t after within. The log is
// read from offset from (skip what an earlier boot printed).
func WaitConsole(t testing.TB, path string, from int64, prefix string, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(path); err == nil && int64(len(b)) >= from {
			lines := strings.Split(string(b[from:]), "\n")
			for _, l := range lines[:len(lines)-1] { // whole lines only: the last may be half written
				if l = strings.TrimRight(l, "\r"); strings.HasPrefix(l, prefix) {
					return l
				}
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("no console line %q within %v; console:\n%s", prefix, within, tail(b, 3000))
		}
		<-tick.C
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
