package loopdevtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Attach attaches p to a free loop device (losetup -f --show, with opts
// such as "-P" before the file) and detaches it when the test ends. It
// skips the test where that is not possible: no losetup, not root, or no
// loop driver.
func Attach(t testing.TB, p string, opts ...string) string {
	t.Helper()
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		t.Skip("losetup not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	args := append(append([]string{"-f", "--show"}, opts...), p)
	out, err := exec.Command(losetup, args...).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command(losetup, "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("detaching %s: %v: %s", dev, err, out)
		}
	})
	return dev
}
