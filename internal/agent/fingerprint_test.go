package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestFingerprintHost(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("/sys/devices/system/cpu/online", "0-3,6,8-9\n")
	write("/proc/meminfo", "MemTotal:       1024 kB\nMemFree: 12 kB\n")
	write("/sys/block/vda/size", "1")
	write("/sys/block/nvme0n1/size", "1")
	write("/sys/class/net/lo/mtu", "1")
	write("/sys/class/net/eth0/mtu", "1")
	write("/etc/machine-id", "abc\n")

	cores, mem, blocks, nics := FingerprintHost(root)
	if cores != 7 {
		t.Errorf("cores = %d, want 7", cores)
	}
	if mem != 1024*1024 {
		t.Errorf("mem = %d", mem)
	}
	if !reflect.DeepEqual(blocks, []string{"nvme0n1", "vda"}) {
		t.Errorf("blocks = %v", blocks)
	}
	if !reflect.DeepEqual(nics, []string{"eth0"}) {
		t.Errorf("nics = %v", nics)
	}
	a, b := MachineID(root, "n1"), MachineID(root, "n2")
	if a == b || a != MachineID(root, "n1") || len(a) != 32 {
		t.Errorf("machine IDs %q %q", a, b)
	}
}

func TestOnlineCPUs(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		in   string
		want int
	}{{"0", 1}, {"0-1", 2}, {"0-3,5", 5}, {"x", 0}, {"3-1", 0}} {
		p := filepath.Join(dir, "online")
		if err := os.WriteFile(p, []byte(tc.in), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := onlineCPUs(p); got != tc.want {
			t.Errorf("onlineCPUs(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}
