package main

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestExplainInfeasibleExitStatus: the binary's explain (and lease
// create --dry-run) of a request no device can hold prints the plan and
// why, in text and in -o json, and exits with status 3, which scripts
// tell from a feasible plan (0) and from a plan that could not be had
// (1: the control plane refused the request); -h says so. It exited 0.
func TestExplainInfeasibleExitStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	c := testcluster.Start(t, testcluster.Options{Nodes: 1, Devices: []agent.DeviceConfig{
		{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20},
	}})
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"RIALTO_ADDR=" + c.URL, "RIALTO_TOKEN=" + testcluster.AdminToken, "HOME=" + t.TempDir()}
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("rialto %v: %v", args, err)
		}
		return out.String(), errb.String(), cmd.ProcessState.ExitCode()
	}

	// A lease of 5000KiB leaves 3192KiB of the 8MiB: explanations print it
	// as every size is printed, in the largest unit ("3.1MiB"), not as
	// "3192KiB".
	if out, errs, code := cli("lease", "create", "--kind", "block", "--size", "5000KiB"); code != 0 {
		t.Fatalf("lease create: exit %d\n%s%s", code, out, errs)
	}
	for _, verb := range [][]string{{"explain"}, {"lease", "create", "--dry-run"}} {
		args := append(verb, "--kind", "block", "--size", "1GiB")
		out, errs, code := cli(args...)
		if code != 3 {
			t.Errorf("%v of an infeasible request: exit %d, want 3\n%s%s", args, code, out, errs)
		}
		for _, w := range []string{"Plan:  infeasible", "Why:", "capacity", "disk0", "3.1MiB free, needs"} {
			if !strings.Contains(out, w) {
				t.Errorf("%v: the plan printed lacks %q:\n%s", args, w, out)
			}
		}
		// The plan says why; stderr says where to look next.
		for _, w := range []string{"infeasible", "`rialto devices` lists each device's capacity and allocation"} {
			if !strings.Contains(errs, w) {
				t.Errorf("%v: stderr %q lacks %q", args, errs, w)
			}
		}
		// Two parts need two devices with room: the one there is says
		// what it has free of what.
		if out, errs, _ := cli(append(verb, "--kind", "block", "--size", "2MiB", "--mode", "composed", "--count", "2")...); !strings.Contains(out, "3.1MiB free of 8MiB, 1 lease") {
			t.Errorf("%v of a 2-way composition: the plan does not give the device's free capacity as 3.1MiB of 8MiB:\n%s%s", verb, out, errs)
		}

		out, errs, code = cli(append(args, "-o", "json")...)
		var p api.Plan
		if err := json.Unmarshal([]byte(out), &p); err != nil || p.State != "infeasible" || len(p.Explanation) == 0 {
			t.Errorf("%v -o json: %v, %+v:\n%s", args, err, p, out)
		}
		if code != 3 {
			t.Errorf("%v -o json of an infeasible request: exit %d, want 3 (%s)", args, code, errs)
		}

		args = append(verb, "--kind", "block", "--size", "1MiB")
		if out, errs, code := cli(args...); code != 0 || !strings.Contains(out, "Plan:  feasible") {
			t.Errorf("%v of a feasible request: exit %d, want 0\n%s%s", args, code, out, errs)
		}
	}
	// An infeasible lease create keeps the control plane's explanation
	// and adds where to look: the devices, and explain for every device's
	// reason (the message gives the first three).
	out, errs, code := cli("lease", "create", "--kind", "block", "--size", "1GiB")
	for _, w := range []string{"(code infeasible, HTTP 422)", "disk0", "3.1MiB free, needs",
		"; `rialto devices` lists each device's capacity and allocation, `rialto explain` with the same flags each device's reason"} {
		if code != 1 || !strings.Contains(errs, w) {
			t.Errorf("lease create of an infeasible request: exit %d, stderr lacks %q:\n%s%s", code, w, out, errs)
		}
	}
	// A request the control plane refuses gets no plan: status 1.
	if out, errs, code := cli("explain", "--kind", "block", "--size", "1MiB", "--mode", "composed", "--count", "1"); code != 1 || !strings.Contains(errs, "invalid_request") {
		t.Errorf("explain of an invalid request: exit %d, want 1\n%s%s", code, out, errs)
	}
	if out, _, code := cli("explain", "-h"); code != 0 || !strings.Contains(out, "Exit status: 0 if the request is feasible; 3 if it is infeasible") {
		t.Errorf("explain -h (exit %d) does not give the exit status:\n%s", code, out)
	}
}
