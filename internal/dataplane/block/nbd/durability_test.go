package nbd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

const childEnv = "RIALTO_NBD_TEST_SERVE_FILE"

func TestMain(m *testing.M) {
	if p := os.Getenv(childEnv); p != "" {
		serveChild(p)
		return
	}
	os.Exit(m.Run())
}

// serveChild is the lender process of the durability test: it serves p and
// prints its address, until it is killed.
func serveChild(p string) {
	b, err := OpenFile(p, FileOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := &Server{}
	s.AddExport(Export{Name: testName, Backend: b})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	s.Serve(context.Background(), ln)
}

func startChild(t *testing.T, p string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+p)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if len(s) < 2 {
			t.Fatal("child printed no address")
		}
		return cmd, s[:len(s)-1]
	case <-time.After(30 * time.Second):
		t.Fatal("child did not start")
	}
	return nil, ""
}

func TestDurabilityAcrossSIGKILL(t *testing.T) {
	p := tempFile(t, 16<<20)
	cmd, addr := startChild(t, p)
	c := dial(t, addr, testName)
	data := make([]byte, 8<<20)
	rand.Read(data)
	if _, err := c.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	fua := make([]byte, 1<<20)
	rand.Read(fua)
	if _, err := c.WriteAtContext(context.Background(), fua, 8<<20, true); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// The old connection now fails instead of hanging.
	if _, err := c.ReadAt(make([]byte, 4096), 0); err == nil {
		t.Fatal("read through a killed lender succeeded")
	}
	_, addr2 := startChild(t, p)
	c2 := dial(t, addr2, testName)
	got := make([]byte, 9<<20)
	if _, err := c2.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:8<<20], data) || !bytes.Equal(got[8<<20:], fua) {
		t.Fatal("data acknowledged before SIGKILL was lost")
	}
}
