package agent

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// FingerprintHost reads the host's resources below root ("" for "/"):
// cores from /sys/devices/system/cpu/online (falling back to the Go
// runtime), memory from /proc/meminfo, block devices from /sys/block and
// NICs from /sys/class/net. Missing files leave fields empty.
func FingerprintHost(root string) (cores int, memBytes int64, blocks, nics []string) {
	p := func(s string) string { return filepath.Join(root, s) }
	cores = onlineCPUs(p("/sys/devices/system/cpu/online"))
	if cores <= 0 {
		cores = runtime.NumCPU()
	}
	memBytes = memTotal(p("/proc/meminfo"))
	blocks = listDir(p("/sys/block"), nil)
	nics = listDir(p("/sys/class/net"), func(n string) bool { return n != "lo" })
	return
}

func onlineCPUs(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, ok := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		z := a
		if ok {
			if z, err = strconv.Atoi(hi); err != nil || z < a {
				return 0
			}
		}
		n += z - a + 1
	}
	return n
}

func memTotal(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			v, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0
			}
			if len(fields) >= 3 && strings.EqualFold(fields[2], "kB") {
				v *= 1024
			}
			return v
		}
	}
	return 0
}

func listDir(dir string, keep func(string) bool) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if keep == nil || keep(e.Name()) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// MachineID derives a node's hardware identity from the host's
// /etc/machine-id (below root) and the node name, so that several agents
// on one host (as in `rialto up`) have distinct, stable identities.
func MachineID(root, name string) string {
	base := "unknown"
	for _, f := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(filepath.Join(root, f)); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			base = strings.TrimSpace(string(b))
			break
		}
	}
	if base == "unknown" {
		if h, err := os.Hostname(); err == nil {
			base = "host:" + h
		}
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%s", base, name)))
	return hex.EncodeToString(sum[:16])
}
