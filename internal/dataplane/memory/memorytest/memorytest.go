package memorytest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/pki"
	"golang.org/x/sys/unix"
)

// Credential is the credential of the region every donor here serves.
const Credential = "lease-cred-0123456789abcdef"

// Donor is a donor serving in this process.
type Donor struct {
	D    *donor.Donor
	Addr string // its loopback address
	// ClientTLS is how Move dials it when it requires TLS (ClientTLS of
	// its CA); the test sets it.
	ClientTLS *tls.Config
}

// Start serves a donor with a region of size bytes under Credential, with
// the given queue credit window (0: the default), until the test ends.
func Start(t testing.TB, size int64, credits int) *Donor {
	t.Helper()
	return start(t, size, credits, nil, nil)
}

// StartWith is Start with set (nil: none) setting the donor's fields
// (its connection limits, say) before it serves.
func StartWith(t testing.TB, size int64, credits int, set func(*donor.Donor)) *Donor {
	t.Helper()
	return start(t, size, credits, nil, set)
}

// StartTLS is Start with a donor that requires TLS with cfg (ServerTLS,
// or a configuration of the test's own).
func StartTLS(t testing.TB, cfg *tls.Config, size int64, credits int) *Donor {
	t.Helper()
	return start(t, size, credits, cfg, nil)
}

// StartTLSWith is StartTLS with set (nil: none) setting the donor's
// fields before it serves.
func StartTLSWith(t testing.TB, cfg *tls.Config, size int64, credits int, set func(*donor.Donor)) *Donor {
	t.Helper()
	return start(t, size, credits, cfg, set)
}

// NewCA makes a cluster CA in a temporary directory.
func NewCA(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := pki.Open(t.TempDir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// ServerTLS is a donor's TLS configuration: a certificate from ca for
// 127.0.0.1.
func ServerTLS(t testing.TB, ca *pki.CA) *tls.Config {
	t.Helper()
	cfg, err := ca.ServerConfig("donor", []string{"127.0.0.1"}, tls.NoClientCert, 0)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// ClientTLS trusts ca, as a borrower holding its ca-cert.pem does.
func ClientTLS(t testing.TB, ca *pki.CA) *tls.Config {
	t.Helper()
	cfg, err := pki.LoadClientTLS(ca.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func start(t testing.TB, size int64, credits int, tlsCfg *tls.Config, set func(*donor.Donor)) *Donor {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return StartOn(t, ln, tlsCfg, size, credits, set)
}

// StartOn is StartWith (StartTLSWith if tlsCfg is set) serving on ln (a
// listener whose sockets the test configured: a small send buffer, say),
// which it closes at the test's end.
func StartOn(t testing.TB, ln net.Listener, tlsCfg *tls.Config, size int64, credits int, set func(*donor.Donor)) *Donor {
	t.Helper()
	d := donor.New(nil)
	d.TLS = tlsCfg
	d.Credits = credits
	if set != nil {
		set(d)
	}
	if err := d.AddRegion(Credential, size); err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		_ = d.RemoveRegion(Credential)
	})
	return &Donor{D: d, Addr: ln.Addr().String()}
}

// Environment of a child donor process.
const (
	childEnv     = "RIALTO_MEMTEST_DONOR"
	childSizeEnv = "RIALTO_MEMTEST_SIZE"
	childSpinEnv = "RIALTO_MEMTEST_SPIN"
	childTLSEnv  = "RIALTO_MEMTEST_TLS_DIR" // a CA directory: serve TLS with a certificate from it
)

// RunChildIfAsked turns the process into a child donor when StartChild
// started it, and never returns then; otherwise it returns at once. Call it
// first in TestMain.
func RunChildIfAsked() {
	if os.Getenv(childEnv) != "1" {
		return
	}
	d := donor.New(nil)
	if v, err := time.ParseDuration(os.Getenv(childSpinEnv)); err == nil {
		d.Spin = v
	}
	size := int64(64 << 20)
	if v, err := strconv.ParseInt(os.Getenv(childSizeEnv), 10, 64); err == nil {
		size = v
	}
	if err := d.AddRegion(Credential, size); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	if dir := os.Getenv(childTLSEnv); dir != "" {
		ca, err := pki.Load(dir, pki.Options{})
		if err == nil {
			d.TLS, err = ca.ServerConfig("donor", []string{"127.0.0.1"}, tls.NoClientCert, 0)
		}
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	_ = d.Serve(context.Background(), ln)
	os.Exit(0)
}

// StartChild runs a donor with a 64 MiB region (or size bytes) in a child
// process (this test binary re-executed) until the test ends, and returns
// the process and the donor's address.
func StartChild(t testing.TB, size ...int64) (*exec.Cmd, string) {
	t.Helper()
	return startChild(t, "", size...)
}

// StartChildTLS is StartChild with a donor that requires TLS, its
// certificate from ca for 127.0.0.1.
func StartChildTLS(t testing.TB, ca *pki.CA, size ...int64) (*exec.Cmd, string) {
	t.Helper()
	return startChild(t, ca.Dir(), size...)
}

func startChild(t testing.TB, tlsDir string, size ...int64) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	if tlsDir != "" {
		cmd.Env = append(cmd.Env, childTLSEnv+"="+tlsDir)
	}
	if len(size) > 0 {
		cmd.Env = append(cmd.Env, childSizeEnv+"="+strconv.FormatInt(size[0], 10))
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	line = strings.TrimSuffix(line, "\n")
	if strings.HasPrefix(line, "ERR ") {
		t.Fatalf("child donor: %s", line)
	}
	return cmd, line
}

// CheckOffNetpoller fails the test if a socket of one of fds (descriptor →
// what it is) is registered with an epoll instance of this process (the Go
// netpoller's among them) under any descriptor: every segment arriving
// would wake that instance's idle thread (docs/memory-protocol.md).
func CheckOffNetpoller(t testing.TB, fds map[int]string) {
	t.Helper()
	for _, r := range Registrations(t, fds) {
		t.Error(r)
	}
}

// Registrations describes each registration of a socket of one of fds
// (descriptor → what it is) with an epoll instance of this process, under
// any descriptor (none: the sockets are off the netpoller).
func Registrations(t testing.TB, fds map[int]string) []string {
	t.Helper()
	// Sockets by inode: a registration under another descriptor of the
	// same socket counts too.
	socks := map[uint64]string{}
	for fd, what := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		socks[st.Ino] = what
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	polls := 0
	var regs []string
	for _, e := range ents {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target != "anon_inode:[eventpoll]" {
			continue
		}
		polls++
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(info), "\n") {
			_, rest, ok := strings.Cut(line, " ino:")
			if !strings.HasPrefix(line, "tfd:") || !ok {
				continue
			}
			ino, err := strconv.ParseUint(strings.Fields(rest)[0], 16, 64)
			if err == nil && socks[ino] != "" {
				regs = append(regs, fmt.Sprintf("%s is registered with epoll instance %s: %s", socks[ino], e.Name(), line))
			}
		}
	}
	if polls == 0 {
		t.Fatal("no epoll instance found: the Go netpoller should have one")
	}
	return regs
}
