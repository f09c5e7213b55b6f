package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestAttachSocketLeftByKilledAttach: the --socket a killed attach left
// behind (nobody listens on it) does not keep the next attach from serving
// there; a --socket some process listens on is refused, naming the path,
// and so is a path that is not a socket.
func TestAttachSocketLeftByKilledAttach(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	procEnv := []string{"RIALTO_ADDR=" + c.URL, "RIALTO_TOKEN=" + testcluster.AdminToken, "XDG_RUNTIME_DIR=" + runtime}
	sock := filepath.Join(t.TempDir(), "vol.sock")

	p, _ := startProc(t, bin, procEnv, "nbd+unix://", "attach", l.ID, "--socket", sock)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("a killed attach left no socket at %s: %v %v", sock, fi, err)
	}

	p, uri := startProc(t, bin, procEnv, "nbd+unix://", "attach", l.ID, "--socket", sock)
	defer func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
	}()
	uri = "nbd+unix://" + uri
	nc, err := nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatalf("dial the attach that followed a killed one at %s: %v", uri, err)
	}
	if _, err := nc.WriteAt([]byte("after a killed attach"), 0); err != nil {
		t.Error(err)
	}
	nc.Close()

	// Another lease's attach at the socket the live attach serves on is
	// refused, and the live attach keeps its socket.
	l2, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeShared, Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runIn(t, c, runtime, "attach", l2.ID, "--socket", sock); code != 1 || !strings.Contains(errs, sock) || !strings.Contains(errs, "listens") {
		t.Errorf("attach at a socket another attach serves on: exit %d, %q; want 1 and a message naming %s", code, errs, sock)
	}
	nc, err = nbd.DialURI(ctx, uri)
	if err != nil {
		t.Fatalf("the live attach lost its socket to a refused one: %v", err)
	}
	nc.Close()

	// A regular file at the path is not removed.
	file := filepath.Join(t.TempDir(), "not-a-socket")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runIn(t, c, runtime, "attach", l2.ID, "--socket", file); code != 1 || !strings.Contains(errs, file) {
		t.Errorf("attach at a regular file: exit %d, %q; want 1 and a message naming %s", code, errs, file)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Errorf("attach at a regular file changed it: %q %v", b, err)
	}
}
