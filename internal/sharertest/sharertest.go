package sharertest

import (
	"os"
	"os/exec"
	"sync"
	"testing"
)

// Share starts a child process (cat, reading a pipe the test holds)
// given copies of files' descriptors, which it keeps until end, or the
// test's end, ends it. A machine that cannot start it skips the test.
func Share(t testing.TB, files ...*os.File) (end func()) {
	t.Helper()
	cmd := exec.Command("cat")
	cmd.ExtraFiles = files
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("no child process: %v", err)
	}
	var once sync.Once
	end = func() {
		once.Do(func() {
			in.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("the child sharing the descriptors: %v", err)
			}
		})
	}
	t.Cleanup(end)
	return end
}
