package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/testcluster"
	"github.com/rialto-project/rialto/internal/vm"
)

func TestParseDest(t *testing.T) {
	self, _ := os.Executable()
	for _, tc := range []struct {
		to     string
		prefix string
		bin    string
		err    string
	}{
		{"local", "", self, ""},
		{"exec:ssh -o SendEnv=RIALTO_TOKEN host2", "ssh -o SendEnv=RIALTO_TOKEN host2", "/opt/rialto", ""},
		{"exec:", "", "", "no command"},
		{"netns:", "", "", "bad namespace name"},
		{"netns:a/b", "", "", "bad namespace name"},
		{"netns:rialto-no-such-namespace", "", "", "no network namespace rialto-no-such-namespace"},
		{"host2", "", "", "want netns:NAME, local or exec:COMMAND"},
	} {
		l, err := parseDest(tc.to, "/opt/rialto")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want %q", tc.to, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(l.prefix, " ") != tc.prefix || l.bin != tc.bin {
			t.Errorf("%q: %+v %v", tc.to, l, err)
		}
	}
	if _, err := exec.LookPath("ip"); err == nil && os.Geteuid() == 0 {
		// A namespace that exists.
		ns := "rialto-vmtest-" + filepath.Base(t.TempDir())
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v %s", err, out)
		}
		defer exec.Command("ip", "netns", "delete", ns).Run()
		l, err := parseDest("netns:"+ns, "")
		if err != nil || strings.Join(l.prefix, " ") != "ip netns exec "+ns || l.name != "netns:"+ns {
			t.Errorf("netns: %+v %v", l, err)
		}
	}
}

// The vm verbs refuse what cannot work before starting anything, list
// and stop stale records, and print the table people read.
func TestVMVerbs(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 8 << 20},
	}})
	mem, err := c.Client().CreateLease(t.Context(), api.LeaseRequest{Kind: api.KindMemory, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	state := filepath.Join(t.TempDir(), "vms")
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(kernel, []byte("not really"), 0o600)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"vm", "run", "--kernel", kernel}, 2, "--disk and --kernel are required"},
		{[]string{"vm", "run", "--disk", "lease-x"}, 2, "--disk and --kernel are required"},
		{[]string{"vm", "run", "--disk", mem.ID, "--kernel", kernel, "--memory", "100KiB"}, 2, "bad --memory"},
		{[]string{"vm", "run", "--disk", mem.ID, "--kernel", kernel, "--name", "../x"}, 1, "name"},
		{[]string{"vm", "run", "--disk", mem.ID, "--kernel", kernel, "--state-dir", state}, 1, "a VM's disk is a block lease"},
		{[]string{"vm", "run", "--disk", "lease-nope", "--kernel", kernel, "--state-dir", state}, 1, "not found"},
		{[]string{"vm", "stop", "nope", "--state-dir", state}, 1, "no such VM"},
		{[]string{"vm", "move", "nope", "--state-dir", state}, 2, "--to is required"},
		{[]string{"vm", "move", "nope", "--to", "local", "--state-dir", state}, 1, "no such VM"},
	} {
		_, errs, code := runIn(t, c, runtime, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}

	// A record whose processes are gone: listed dead, refused by move,
	// removed by stop.
	stale := vm.Record{Name: "old", Host: "netns:x", PID: 999999999, QEMUPID: 999999998, Lease: "lease-1", Parts: 1,
		MemoryMiB: 256, Accel: "tcg", Started: time.Now().Add(-time.Hour)}
	if err := vm.SaveRecord(state, stale); err != nil {
		t.Fatal(err)
	}
	out, _, code := runIn(t, c, runtime, "vm", "list", "--state-dir", state, "-o", "json")
	var listed []vmListed
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 1 || listed[0].State != "dead" || listed[0].Name != "old" {
		t.Fatalf("vm list: %d %s", code, out)
	}
	if _, errs, code := runIn(t, c, runtime, "vm", "move", "old", "--to", "local", "--state-dir", state); code != 1 || !strings.Contains(errs, "VM old is not running") {
		t.Errorf("move a dead VM: %d %s", code, errs)
	}
	if out, errs, code := runIn(t, c, runtime, "vm", "run", "--disk", "lease-1", "--kernel", kernel, "--name", "old", "--state-dir", state); code == 0 ||
		strings.Contains(errs, "already runs") {
		t.Errorf("vm run over a dead record: %d %s %s", code, out, errs)
	}
	if out, _, code := runIn(t, c, runtime, "vm", "stop", "old", "--state-dir", state); code != 0 || !strings.Contains(out, "VM old was not running (stale record removed)") {
		t.Errorf("vm stop of a dead VM: %d %s", code, out)
	}
	if out, _, code := runIn(t, c, runtime, "vm", "list", "--state-dir", state); code != 0 || strings.Contains(out, "old") {
		t.Errorf("vm list after stop: %s", out)
	}

	var b bytes.Buffer
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	printVMs(&b, []vmListed{
		{Record: vm.Record{Name: "db", Host: "netns:rialto-rack-1-h2", PID: 4242, Lease: "lease-abc", Parts: 3, MemoryMiB: 1024, Accel: "kvm", Started: now.Add(-90 * time.Second)}, State: "running"},
		{Record: vm.Record{Name: "web", Host: "host7", PID: 17, Lease: "lease-def", Parts: 1, MemoryMiB: 256, Accel: "tcg"}, State: "dead"},
	}, now)
	want := "NAME  STATE    HOST                    LEASE      PARTS  MEMORY  ACCEL  PID   STARTED\n" +
		"db    running  netns:rialto-rack-1-h2  lease-abc  3      1GiB    kvm    4242  1m30s ago\n" +
		"web   dead     host7                   lease-def  1      256MiB  tcg    17    -\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}
