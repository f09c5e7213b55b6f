package stats

import (
	"math"
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{7}, 7},
	} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) is not NaN")
	}
}

// TestProcCPUCountsChildren: a shell burning CPU in a child process is
// counted, while it runs and after it is reaped.
func TestProcCPUCountsChildren(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	// The child spins until the file it watches disappears.
	flag := t.TempDir() + "/spin"
	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `sh -c 'while [ -e "$0" ]; do :; done' "$0"; sleep 0.01`, flag)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for ProcCPU(cmd.Process.Pid) < 0.2 {
		if time.Now().After(deadline) {
			os.Remove(flag)
			t.Fatalf("child's CPU not counted: %.2f s", ProcCPU(cmd.Process.Pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
	os.Remove(flag)
	if ProcCPU(-1) != 0 {
		t.Error("a missing process counts CPU")
	}
}
