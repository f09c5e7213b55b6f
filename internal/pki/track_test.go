package pki

import (
	"bufio"
	"crypto/tls"
	"errors"
	"github.com/rialto-project/rialto/internal/logtest"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTrackerEndsRevokedConnections: a client holding its copy of the CA
// certificates (Roots) registers its TLS connections (Tracker); when it
// takes a revocation list naming the certificate a server presented,
// from the control plane (UseCRL) or from the file beside its copy
// (read at a check), its connections to that server end at once, with a
// log line naming the peer, the serial number and "revoked", while those
// to other servers go on, and a connection no longer tracked is left
// alone. A connection whose handshake verified before a list the client
// took since is refused at its registration.
func TestTrackerEndsRevokedConnections(t *testing.T) {
	t.Parallel()
	ca, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	clientDir := t.TempDir()
	file := filepath.Join(clientDir, CACertFile)
	if err := os.WriteFile(file, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := LoadRoots(file)
	if err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	track := r.Tracker(slog.New(slog.NewTextHandler(&logs, nil)))

	srvA, srvB := echoServer(t, ca, "track-a"), echoServer(t, ca, "track-b")
	type conn struct {
		tc      *tls.Conn
		untrack func()
		ended   chan error
	}
	dial := func(addr string) conn {
		t.Helper()
		cfg := r.ClientTLS()
		cfg.ServerName = "127.0.0.1"
		tc, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tc.Close() })
		c := conn{tc: tc, ended: make(chan error, 1)}
		c.untrack, err = track(addr, tc.ConnectionState(), func(err error) {
			c.ended <- err
			tc.Close()
		})
		if err != nil {
			t.Fatalf("tracking a connection to %s: %v", addr, err)
		}
		return c
	}
	a, b := dial(srvA.addr), dial(srvB.addr)
	for _, c := range []conn{a, b} {
		if err := echo(t, c.tc); err != nil {
			t.Fatal(err)
		}
	}

	// The control plane's list revokes A's certificate.
	if err := ca.Revoke(srvA.serial()); err != nil {
		t.Fatal(err)
	}
	if took, err := r.UseCRL(ca.CRLPEM()); err != nil || !took {
		t.Fatalf("UseCRL: %v, %v", took, err)
	}
	select {
	case err := <-a.ended:
		if !errors.Is(err, ErrRevoked) {
			t.Fatalf("the connection to the revoked server ended with %v, want %v", err, ErrRevoked)
		}
	default:
		t.Fatal("the connection to the server whose certificate the list revokes was not ended when the list was taken")
	}
	if err := echo(t, a.tc); err == nil {
		t.Fatal("the connection to the revoked server still carries data")
	}
	for _, want := range []string{"revoked", "peer=" + srvA.addr, "serial=" + srvA.serial().Text(16), "subject=track-a"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	if err := echo(t, b.tc); err != nil {
		t.Fatalf("the connection to a server not revoked: %v", err)
	}
	select {
	case err := <-b.ended:
		t.Fatalf("the connection to a server not revoked was ended: %v", err)
	default:
	}
	// A handshake that verified before the list was taken.
	if _, err := track(srvA.addr, a.tc.ConnectionState(), func(error) {}); !errors.Is(err, ErrRevoked) {
		t.Fatalf("tracking a connection to the revoked server: %v, want %v", err, ErrRevoked)
	}

	// The file beside the copy revokes B's certificate: b is no longer
	// tracked, b2 is.
	b2 := dial(srvB.addr)
	b.untrack()
	b.untrack() // idempotent
	if err := ca.Revoke(srvB.serial()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(clientDir, CRLFile), ca.CRLPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := r.CRLNumber(); n == nil || n.Cmp(ca.CRLNumber()) != 0 {
		t.Fatalf("the file's list was not taken: number %v, want %v", n, ca.CRLNumber())
	}
	select {
	case err := <-b2.ended:
		if !errors.Is(err, ErrRevoked) {
			t.Fatalf("ended with %v, want %v", err, ErrRevoked)
		}
	default:
		t.Fatal("the file's list did not end the tracked connection to the server it revokes")
	}
	if err := echo(t, b.tc); err != nil {
		t.Fatalf("a connection no longer tracked was ended: %v", err)
	}
}

// tlsEchoServer is a TLS server echoing lines, with a certificate of a
// CA.
type tlsEchoServer struct {
	addr string
	cert *tls.Certificate
}

func (s *tlsEchoServer) serial() *big.Int { return s.cert.Leaf.SerialNumber }

// echoServer serves TLS on a loopback port with a certificate ca issues
// for cn, echoing each line, until the test ends.
func echoServer(t *testing.T, ca *CA, cn string) *tlsEchoServer {
	t.Helper()
	iss, err := ca.Issue(Request{CommonName: cn, Hosts: []string{"127.0.0.1"}, Usage: ServerAuth, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{c}})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := conn.Write([]byte(line)); err != nil {
						return
					}
				}
			})
		}
	})
	return &tlsEchoServer{addr: ln.Addr().String(), cert: &c}
}

// TestTrackerEndsConnectionsOfADroppedCA: a client holding its copy of
// the CA certificates (Roots) registers its TLS connections (Tracker);
// a rotation it follows (Use: the new CA's certificate and the old one's)
// ends none, and once it takes the bundle of a `rialto ca drop-old` (the
// new CA's alone), its connections to a server still presenting a
// certificate of the old CA end at once (ErrUntrusted), with a log line
// naming the peer, the serial number, the old CA and "no longer
// trusted", whether its handshake verified a chain or pinned the
// server's key (no chain verified), while those to a server of the new
// CA go on. A registration of a connection to the old CA's server is
// refused from then on, and CheckConn, a server's check on each request,
// refuses its peer too. Before, a connection lived as long as its
// handshake had verified: the dropped CA's server went on serving it.
func TestTrackerEndsConnectionsOfADroppedCA(t *testing.T) {
	t.Parallel()
	ca, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), CACertFile)
	if err := os.WriteFile(file, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := LoadRoots(file)
	if err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	track := r.Tracker(slog.New(slog.NewTextHandler(&logs, nil)))
	type conn struct {
		tc    *tls.Conn
		ended chan error
	}
	dial := func(addr string, pinned bool) conn {
		t.Helper()
		cfg := r.ClientTLS()
		cfg.ServerName = "127.0.0.1"
		if pinned { // as a memory lease's handed-off connection: no chain verified
			cfg.InsecureSkipVerify, cfg.VerifyConnection = true, nil
		}
		tc, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tc.Close() })
		if cs := tc.ConnectionState(); pinned != (len(cs.VerifiedChains) == 0) {
			t.Fatalf("dial of %s (pinned %v): %d chains verified", addr, pinned, len(cs.VerifiedChains))
		}
		c := conn{tc: tc, ended: make(chan error, 1)}
		if _, err := track(addr, tc.ConnectionState(), func(err error) {
			// An end function may use the Roots (a redial asks for
			// its configuration): Use ends connections once it let
			// go of its lock. It ended them holding it, and a Reload
			// here waited for ever.
			if _, rerr := r.Reload(); rerr != nil {
				t.Errorf("Reload from an end function: %v", rerr)
			}
			c.ended <- err
			tc.Close()
		}); err != nil {
			t.Fatalf("tracking a connection to %s: %v", addr, err)
		}
		return c
	}
	notEnded := func(what string, cs ...conn) {
		t.Helper()
		for _, c := range cs {
			select {
			case err := <-c.ended:
				t.Fatalf("%s: a connection was ended: %v", what, err)
			default:
			}
			if err := echo(t, c.tc); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}

	srvOld := echoServer(t, ca, "dropped-old")
	oldCA := ca.Certificate()
	old, oldPinned := dial(srvOld.addr, false), dial(srvOld.addr, true)
	if err := ca.Rotate(); err != nil {
		t.Fatal(err)
	}
	rotated, err := ParseCerts(ca.CertPEM())
	if err != nil || len(rotated) != 2 {
		t.Fatalf("the rotated bundle: %d certificates, %v", len(rotated), err)
	}
	if took, err := r.Use(rotated); err != nil || !took {
		t.Fatalf("Use of the rotated bundle: %v, %v", took, err)
	}
	notEnded("a rotation adding a CA", old, oldPinned)
	srvNew := echoServer(t, ca, "dropped-new")
	cur, curPinned := dial(srvNew.addr, false), dial(srvNew.addr, true)

	if err := ca.DropOld(); err != nil {
		t.Fatal(err)
	}
	dropped, err := ParseCerts(ca.CertPEM())
	if err != nil || len(dropped) != 1 {
		t.Fatalf("the bundle after drop-old: %d certificates, %v", len(dropped), err)
	}
	used := make(chan error, 1)
	go func() {
		took, err := r.Use(dropped)
		if err == nil && !took {
			err = errors.New("not taken")
		}
		used <- err
	}()
	select {
	case err := <-used:
		if err != nil {
			t.Fatalf("Use of drop-old's bundle: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Use of drop-old's bundle did not return: the end functions it called wait for its lock")
	}
	for _, c := range []conn{old, oldPinned} {
		select {
		case err := <-c.ended:
			if !errors.Is(err, ErrUntrusted) {
				t.Fatalf("the connection to the old CA's server ended with %v, want %v", err, ErrUntrusted)
			}
		default:
			t.Fatal("the connection to a server presenting a certificate of the dropped CA was not ended when the client took the bundle without it")
		}
		if err := echo(t, c.tc); err == nil {
			t.Fatal("the connection to the dropped CA's server still carries data")
		}
	}
	if n := strings.Count(logs.String(), "no longer trusted: its CA was dropped"); n != 2 {
		t.Fatalf("want two lines ending the two connections:\n%s", logs.String())
	}
	for _, want := range []string{"peer=" + srvOld.addr, "serial=" + srvOld.serial().Text(16), "subject=dropped-old", "issuer=" + strconv.Quote(oldCA.Subject.CommonName)} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	notEnded("a server of the CA kept", cur, curPinned)

	oldCS := old.tc.ConnectionState()
	if _, err := track(srvOld.addr, oldCS, func(error) {}); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("tracking a connection to the dropped CA's server: %v, want %v", err, ErrUntrusted)
	}
	if err := r.crl.CheckConn(oldCS); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("CheckConn of the dropped CA's server: %v, want %v", err, ErrUntrusted)
	}
	if err := r.crl.CheckConn(cur.tc.ConnectionState()); err != nil {
		t.Fatalf("CheckConn of the kept CA's server: %v", err)
	}
	if err := ca.Revoke(srvNew.serial()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.UseCRL(ca.CRLPEM()); err != nil {
		t.Fatal(err)
	}
	if err := r.crl.CheckConn(cur.tc.ConnectionState()); !errors.Is(err, ErrRevoked) {
		t.Fatalf("CheckConn of a revoked server: %v, want %v", err, ErrRevoked)
	}
}

// echo sends a line on tc, a connection to an echoServer, and reads it
// back; an error says the connection no longer carries data.
func echo(t *testing.T, tc *tls.Conn) error {
	t.Helper()
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(tc).ReadString('\n')
	if err == nil && line != "ping\n" {
		t.Fatalf("echo: %q", line)
	}
	return err
}
