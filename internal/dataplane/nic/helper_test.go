package nic

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"github.com/rialto-project/rialto/internal/logtest"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/pki"
)

// The tests run lenders and borrowers as processes of this test binary
// inside the lab's namespaces (as rialto agent and rialto attach run):
// TestMain becomes one when NIC_HELPER is set.
func TestMain(m *testing.M) {
	switch os.Getenv("NIC_HELPER") {
	case "lender":
		os.Exit(helperLender())
	case "borrower":
		os.Exit(helperBorrower())
	case "race":
		os.Exit(helperRace())
	}
	os.Exit(m.Run())
}

type lenderSpec struct {
	Iface  string      `json:"iface"`
	Listen string      `json:"listen"`
	Rate   uint64      `json:"rate"`
	Leases []LeaseSpec `json:"leases"`
	// CertPEM and KeyPEM, if set, are the lender's certificate: its
	// tunnel runs under TLS.
	CertPEM []byte `json:"cert,omitempty"`
	KeyPEM  []byte `json:"key,omitempty"`
}

func helperLender() int {
	var spec lenderSpec
	if err := json.Unmarshal([]byte(os.Getenv("NIC_SPEC")), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var srv *tls.Config
	if spec.CertPEM != nil {
		cert, err := tls.X509KeyPair(spec.CertPEM, spec.KeyPEM)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		srv = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	l, err := NewLender(ctx, LenderConfig{Iface: spec.Iface, Rate: spec.Rate, TLS: srv, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	for _, ls := range spec.Leases {
		if err := l.AddLease(ctx, ls); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	ln, err := net.Listen("tcp", spec.Listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	go func() { // stdin closing (the test ending) stops the lender too
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		stop()
	}()
	if err := l.Serve(ctx, ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type borrowerSpec struct {
	Members []Member `json:"members"`
	Mode    Mode     `json:"mode"`
	Conns   int      `json:"conns"`
	Name    string   `json:"name"`
	// CAPEM, if set, is the cluster CA that TLS members' certificates
	// must chain to, for ServerName (empty: the host dialled).
	CAPEM      []byte `json:"ca,omitempty"`
	ServerName string `json:"server_name,omitempty"`
	// CRLPEM, if set, is the CA's revocation list the borrower starts
	// with: it refuses the lenders it names, and its tunnel connections
	// are registered with it (Config.Track), so that a list taken later
	// ("crl FILE") ends those to a lender it revokes.
	CRLPEM []byte `json:"crl,omitempty"`
}

// clientTLSConfig is the borrower's TLS configuration for the CA in caPEM
// (nil if none).
func clientTLSConfig(caPEM []byte, serverName string) (*tls.Config, error) {
	if caPEM == nil {
		return nil, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no CA certificate in %q", caPEM)
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName}, nil
}

// staticTLS is a Config.TLS that always returns cfg (nil: none).
func staticTLS(cfg *tls.Config) func() *tls.Config {
	if cfg == nil {
		return nil
	}
	return func() *tls.Config { return cfg }
}

type borrowerReport struct {
	Addr    netip.Addr     `json:"addr"`
	Routes  []netip.Prefix `json:"routes"`
	Stats   Stats          `json:"stats"`
	Members []MemberStatus `json:"members"`
	// Log is the borrower's log so far, in the report of a "crl" or
	// "log" command.
	Log string `json:"log,omitempty"`
}

func helperBorrower() int {
	var spec borrowerSpec
	if err := json.Unmarshal([]byte(os.Getenv("NIC_SPEC")), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	logs := &logtest.Buffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	tcfg, err := clientTLSConfig(spec.CAPEM, spec.ServerName)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var crl *pki.CRL
	var track pki.TrackFunc
	if spec.CRLPEM != nil {
		roots, err := pki.ParseCerts(spec.CAPEM)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		crl = pki.NewCRL(roots)
		if _, err := crl.Update(spec.CRLPEM); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		tcfg.VerifyConnection = crl.VerifyPeer
		track = crl.Tracker(log)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	i, err := Attach(ctx, Config{Members: spec.Members, Mode: spec.Mode, Conns: spec.Conns, Name: spec.Name, TLS: staticTLS(tcfg), Track: track, Logger: log})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer i.Close()
	report := func(withLog bool) {
		r := borrowerReport{Addr: i.Addr(), Routes: i.Routes(), Stats: i.Stats(), Members: i.Members()}
		if withLog {
			r.Log = logs.String()
		}
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	}
	report(false)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		// "crl FILE" has the borrower take the revocation list in FILE,
		// then reports, with the log.
		if file, ok := strings.CutPrefix(sc.Text(), "crl "); ok {
			b, err := os.ReadFile(file)
			if err == nil && crl != nil {
				_, err = crl.Update(b)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
			report(true)
			continue
		}
		if sc.Text() == "log" {
			report(true)
			continue
		}
		// "drop K" drops member K (its part declared lost), then reports.
		if k, ok := strings.CutPrefix(sc.Text(), "drop "); ok {
			n, _ := strconv.Atoi(k)
			if err := i.Drop(n); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
		report(false)
	}
	return 0
}

// proc is a helper process.
type proc struct {
	cmd  *exec.Cmd
	in   *os.File
	out  *bufio.Reader
	mu   sync.Mutex
	done chan struct{}
}

func startHelper(t *testing.T, lab *netns.Lab, host int, role string, spec any) (*proc, string) {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := lab.Command(context.Background(), host, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "NIC_HELPER="+role, "NIC_SPEC="+string(b))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &logtest.Buffer{}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: bufio.NewReader(stdout), done: make(chan struct{})}
	p.in = stdin.(*os.File)
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.in.Close()
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s on host %d:\n%s", role, host, stderr.String())
		}
	})
	line, err := readLine(p.out, 30*time.Second)
	if err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		t.Fatalf("%s on host %d did not start: %v\n%s", role, host, err, stderr.String())
	}
	return p, line
}

func readLine(r *bufio.Reader, timeout time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := r.ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case x := <-ch:
		return x.s, x.err
	case <-time.After(timeout):
		return "", fmt.Errorf("no line within %v", timeout)
	}
}

// report asks a borrower helper for its state.
func (p *proc) report(t *testing.T) borrowerReport {
	t.Helper()
	return p.command(t, "stats")
}

// command sends a borrower helper a command line and returns its report.
func (p *proc) command(t *testing.T, line string) borrowerReport {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.in.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := readLine(p.out, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r borrowerReport
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("%v: %q", err, line)
	}
	return r
}
