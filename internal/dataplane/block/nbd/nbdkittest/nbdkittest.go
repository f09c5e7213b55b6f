package nbdkittest

import (
	"net"
	"os"
	"os/exec"
	"testing"
)

// Start runs `nbdkit -f args...` serving on the Unix socket sock (which
// must not exist yet) and returns its command, killed and waited for when
// the test ends. It skips the test when nbdkit is not installed.
func Start(t testing.TB, sock string, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("nbdkit"); err != nil {
		t.Skip("nbdkit not installed")
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", append([]string{"-c", `export LISTEN_PID=$$ LISTEN_FDS=1; exec nbdkit -f "$@"`, "nbdkit"}, args...)...)
	cmd.ExtraFiles = []*os.File{f}
	err = cmd.Start()
	f.Close()
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}
