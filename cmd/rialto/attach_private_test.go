package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// asUser runs name with args as the user u (uid and gid, no
// supplementary groups), from /, and returns what it printed.
func asUser(ctx context.Context, u *user.User, name string, args ...string) (string, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return "", err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestAttachDefaultSocketIsPrivate: by default `rialto attach` serves on
// a Unix socket (mode 0600) in its own state directory (mode 0700, made
// so even if it was there with other modes), and prints its
// nbd+unix:// URI: the owner reads and writes the volume through it with
// libnbd's tools, and another local user who learns the URI (as every
// user sees it in `ps` on the tools' command lines) is refused. The
// socket is gone once detached. With --listen 127.0.0.1:0 attach serves
// on loopback TCP (nbd://), where that other user does get in: what
// --listen's help warns of, and the proof that the refusal above is
// the socket's doing, not the client's.
func TestAttachDefaultSocketIsPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs a client as another user: needs root")
	}
	nbdinfo, err := exec.LookPath("nbdinfo")
	if err != nil {
		t.Skip("needs nbdinfo (libnbd)")
	}
	nbdcopy, err := exec.LookPath("nbdcopy")
	if err != nil {
		t.Skip("needs nbdcopy (libnbd)")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}

	// A runtime directory other users may enter (as a home directory
	// often is), whose rialto directory is there already with mode 0755:
	// only attach's own doing keeps the other user out.
	runtime := t.TempDir()
	for _, d := range []string{filepath.Dir(runtime), runtime} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(runtime, "rialto")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	uri, done := attached(t, c, runtime, l.ID)
	sock := filepath.Join(dir, l.ID+".nbd")
	if !strings.HasPrefix(uri, "nbd+unix:///") || !strings.HasSuffix(uri, "?socket="+sock) {
		t.Fatalf("attach printed %q, want nbd+unix:///NAME?socket=%s", uri, sock)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("attach state directory: %v %v, want mode 0700", fi, err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket: %v %v, want a socket of mode 0600", fi, err)
	}

	// The owner: nbdinfo, and nbdcopy in and out.
	out, err := exec.CommandContext(ctx, nbdinfo, "--size", uri).CombinedOutput()
	if size, perr := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err != nil || perr != nil || size < l.Size {
		t.Fatalf("nbdinfo --size as the owner: %v %v\n%s", err, perr, out)
	}
	tmp := t.TempDir()
	in, back := filepath.Join(tmp, "in"), filepath.Join(tmp, "back")
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, nbdcopy, "--flush", in, uri).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy in as the owner: %v\n%s", err, out)
	}
	if out, err := exec.CommandContext(ctx, nbdcopy, uri, back).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy out as the owner: %v\n%s", err, out)
	}
	if got, err := os.ReadFile(back); err != nil || len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
		t.Errorf("nbdcopy round trip as the owner differs: %v", err)
	}

	// Another user with the URI is refused.
	out2, err := asUser(ctx, nobody, nbdinfo, "--size", uri)
	if err == nil || !strings.Contains(out2, "Permission denied") {
		t.Errorf("nbdinfo as %s (uid %s) with the default URI: %v, want permission denied\n%s", nobody.Username, nobody.Uid, err, out2)
	}

	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 0 {
		t.Fatalf("detach: %d %s", code, errs)
	}
	if code := awaitExit(t, done, "detach returned"); code != 0 {
		t.Errorf("attach exited %d", code)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after detach: %v", err)
	}

	// --listen 127.0.0.1:0: TCP, which the other user reaches with the URI.
	tcpURI, done := attached(t, c, runtime, l.ID, "--listen", "127.0.0.1:0")
	if !strings.HasPrefix(tcpURI, "nbd://127.0.0.1:") {
		t.Fatalf("attach --listen 127.0.0.1:0 printed %q, want nbd://127.0.0.1:PORT/NAME", tcpURI)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("attach --listen made a socket: %v", err)
	}
	if out, err := asUser(ctx, nobody, nbdinfo, "--size", tcpURI); err != nil {
		t.Errorf("nbdinfo as %s with the TCP URI: %v (a client as another user must get in over TCP, or the refusal above proves nothing)\n%s", nobody.Username, err, out)
	}
	if _, errs, code := runIn(t, c, runtime, "detach", l.ID); code != 0 {
		t.Fatalf("detach: %d %s", code, errs)
	}
	if code := awaitExit(t, done, "detach returned"); code != 0 {
		t.Errorf("attach --listen exited %d", code)
	}
}
