package agent

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/metrics"
	"github.com/rialto-project/rialto/internal/sharertest"
)

// listeningFiles are duplicates of this process's descriptors of the TCP
// sockets that listen on ports (as /proc/net/tcp and tcp6 and
// /proc/self/fd tell), one or more per port. Once given to a child
// (exec.Cmd.ExtraFiles), they go to shareListeners.
func listeningFiles(t *testing.T, ports ...int) []*os.File {
	t.Helper()
	want := map[int]bool{}
	for _, p := range ports {
		want[p] = true
	}
	inodes := map[string]int{} // "socket:[INODE]": port
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st ... uid timeout inode
			fl := strings.Fields(sc.Text())
			if len(fl) < 10 || fl[3] != "0A" { // LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(fl[1], ":")
			port, err := strconv.ParseInt(hexPort, 16, 32)
			if err == nil && want[int(port)] {
				inodes["socket:["+fl[9]+"]"] = int(port)
			}
		}
		f.Close()
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var files []*os.File
	found := map[int]bool{}
	for _, e := range fds {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		port, ok := inodes[l]
		if err != nil || !ok {
			continue
		}
		fd, _ := strconv.Atoi(e.Name())
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			continue // closed meanwhile
		}
		files = append(files, os.NewFile(uintptr(d), l))
		found[port] = true
	}
	for _, p := range ports {
		if !found[p] {
			t.Fatalf("no listening socket of port %d in this process", p)
		}
	}
	return files
}

// shareListeners gives a child process (sharer) copies of the listening
// sockets' descriptors files (listeningFiles), and closes files. The
// child's start took them out of non-blocking mode (File.Fd), and with
// them the listeners, whose open file descriptions they share: an
// Accept would block in accept(2), and Close wait for it. A child forked
// by another goroutine changes nothing: back as they were.
func shareListeners(t *testing.T, files []*os.File) {
	t.Helper()
	sharertest.Share(t, files...)
	for _, f := range files {
		if err := unix.SetNonblock(int(f.Fd()), true); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
}

// urlPort is the port of URL u (0: none).
func urlPort(t *testing.T, u string) int {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(pu.Port())
	return p
}

// TestPortsLetGoWhileAChildSharesThem: an agent started again right after
// the last one stopped (a restart in the process) listens at the ports the
// last one did, and serves its exports at their addresses, though a child
// process shares the last one's listening sockets (as one that any
// goroutine forks does until its exec). Closing a listener alone left it
// listening in the child: the next agent found its remembered ports busy
// and moved the agent API, the data plane and the exports to new ones.
func TestPortsLetGoWhileAChildSharesThem(t *testing.T) {
	_, srv := newFakeCP(t)
	dir := t.TempDir()
	cfg := testConfig(srv.URL, dir)
	cfg.Listen = "127.0.0.1"
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.a.Prepare(ctx, api.PrepareRequest{LeaseID: "lease-a", Kind: api.KindBlock, DeviceName: "disk0", Offset: 0, Length: 4096, Export: "x_lease-a"}); err != nil {
		t.Fatal(err)
	}
	apiURL, blockAt := r.a.AgentURL(), r.a.Endpoint(api.KindBlock)
	_, blockPort, err := net.SplitHostPort(blockAt)
	if err != nil {
		t.Fatal(err)
	}
	bp, _ := strconv.Atoi(blockPort)
	files := listeningFiles(t, urlPort(t, apiURL), bp)
	shareListeners(t, files)
	r.halt(t)

	r2 := start(t, cfg)
	if got := r2.a.AgentURL(); got != apiURL {
		t.Errorf("the agent API at %s, the last agent's at %s", got, apiURL)
	}
	if got := r2.a.Endpoint(api.KindBlock); got != blockAt {
		t.Errorf("the block data plane at %s, the last agent's at %s", got, blockAt)
	}
	if n, _ := metrics.Value(r2.a.Metrics(), "rialto_agent_restored_exports_total", "result", "same_address"); n != 1 {
		t.Errorf("%v exports restored at the same address, want 1", n)
	}
}

// TestReservedPortLetGoWhileAChildSharesIt: a port the agent held for its
// owner is the owner's as soon as it is released, though a child process
// shares the reservation's socket. Closing the reservation alone left it
// listening in the child, and the owner moved to another port.
func TestReservedPortLetGoWhileAChildSharesIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var r portReservations
	defer r.releaseAll()
	p := strconv.Itoa(port)
	r.reserve("127.0.0.1", []string{p})
	if r.lns[p] == nil {
		t.Skipf("port %d taken meanwhile", port)
	}
	files := listeningFiles(t, port)
	shareListeners(t, files)
	r.release(p)
	owner, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("the owner of a released port a child shares: %v", err)
	}
	owner.Close()
}
