package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/testcluster"
)

func TestMemtestMemoryLease(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
		{Name: "mem0", Kind: api.KindMemory, Size: 8 << 20},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindMemory, Size: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()

	// memtest runs as the built binary, as a user would: its mapping step
	// re-executes the binary as the fault handler process
	// (memory.RunFaultHandlerIfChild in main). The deadline bounds a hang.
	bin := buildBinary(t)
	memtest := func(args ...string) (string, string, int) {
		t.Helper()
		pctx, pcancel := context.WithTimeout(ctx, 45*time.Second)
		defer pcancel()
		cmd := exec.CommandContext(pctx, bin, append([]string{"memtest"}, args...)...)
		cmd.Env = append(os.Environ(), "RIALTO_ADDR="+c.URL, "RIALTO_TOKEN="+testcluster.AdminToken)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if pctx.Err() != nil {
			t.Fatalf("rialto memtest %v did not finish (a hang?): %s", args, errb.String())
		}
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	out, errs, code := memtest(l.ID)
	if code != 0 {
		t.Fatalf("memtest: exit %d\n%s%s", code, out, errs)
	}
	for _, ch := range []string{"CHANNEL", "sync", "bulk", "queue", "adaptive", "mapping"} {
		if !strings.Contains(out, ch) {
			t.Errorf("memtest output lacks %q:\n%s", ch, out)
		}
	}
	if strings.Contains(out, "skipped") && !strings.Contains(out, "The mapping was not tested") {
		t.Errorf("a skipped mapping is not explained:\n%s", out)
	}
	t.Logf("\n%s", out)

	out, errs, code = memtest(l.ID, "--span", "256KiB", "-o", "json")
	if code != 0 {
		t.Fatalf("memtest -o json: exit %d: %s", code, errs)
	}
	var res memtestOut
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.ID != l.ID || res.State != "ok" || len(res.Steps) != 5 {
		t.Fatalf("memtest JSON %+v", res)
	}
	for _, s := range res.Steps {
		if s.ID == "" || (s.State != "ok" && s.State != "skipped") {
			t.Errorf("step %+v", s)
		}
		if s.State == "ok" && (s.Bytes <= 0 || s.Bytes > 256<<10*1000) {
			t.Errorf("step %s tested %d bytes", s.ID, s.Bytes)
		}
	}

	b, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"memtest", b.ID}, 1, "memtest tests memory leases"},
		{[]string{"memtest"}, 2, "wrong number of arguments"},
		{[]string{"memtest", l.ID, "--span", "lots"}, 2, `invalid argument "lots" for "--span"`},
	} {
		_, errs, code := runIn(t, c, runtime, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	// A released lease's region is gone: memtest fails rather than
	// reporting success.
	if _, err := c.Client().ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runIn(t, c, runtime, "memtest", l.ID); code != 1 || !strings.Contains(errs, "not active") {
		t.Errorf("memtest of a released lease: exit %d, %s", code, errs)
	}
}
