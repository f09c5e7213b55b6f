package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/pki"
)

// TestTLSChannels: every channel carries the same bytes over TLS as in
// plaintext, and the raw sync and bulk connections stay off the netpoller
// (their records travel on the raw syscalls).
func TestTLSChannels(t *testing.T) {
	const size = 4 << 20
	ca := memorytest.NewCA(t)
	td := memorytest.StartTLS(t, memorytest.ServerTLS(t, ca), size, 0)
	c := dial(t, td.Addr, Options{TLS: memorytest.ClientTLS(t, ca), BulkThreshold: 256 << 10})
	if !c.TLS() {
		t.Fatal("not a TLS session")
	}
	ctx := context.Background()
	shadow := make([]byte, size)
	pool := make([]byte, 2<<20)
	_, _ = rand.NewChaCha8([32]byte{7}).Read(pool)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, ch := range channels {
		for _, n := range []int{1, 4096, 40000, 1<<20 + 5} {
			t.Run(fmt.Sprintf("%v-%d", ch, n), func(t *testing.T) {
				off := rng.Int64N(int64(size - n + 1))
				p := pool[:n]
				if err := c.Write(ctx, ch, p, off); err != nil {
					t.Fatal(err)
				}
				copy(shadow[off:], p)
				got := make([]byte, n)
				if err := c.Read(ctx, ch, got, off); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, p) {
					t.Fatalf("%v: read back differs", ch)
				}
			})
		}
	}
	all := make([]byte, size)
	if err := c.Read(ctx, ChannelBulk, all, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(all, shadow) {
		t.Fatal("region differs from shadow")
	}
	fds := map[int]string{c.sync.pg.Load().Fd(): "client sync"}
	for i, s := range c.streams {
		if !s.pg.Load().TLS() {
			t.Fatalf("bulk stream %d is not TLS", i)
		}
		fds[s.pg.Load().Fd()] = fmt.Sprintf("client bulk stream %d", i)
	}
	memorytest.CheckOffNetpoller(t, fds)
}

// TestTLSRefusals: a plaintext client is told the donor requires TLS, a
// TLS client meeting a plaintext donor is told it does not speak TLS, and
// certificates that are not the cluster CA's, expired or for another host
// are refused before the credential leaves.
func TestTLSRefusals(t *testing.T) {
	ca := memorytest.NewCA(t)
	other := memorytest.NewCA(t)
	td := memorytest.StartTLS(t, memorytest.ServerTLS(t, ca), 1<<20, 0)
	plain := memorytest.Start(t, 1<<20, 0)
	ctx := context.Background()
	good := memorytest.ClientTLS(t, ca)

	if _, err := Dial(ctx, td.Addr, testCred, Options{}); !errors.Is(err, protocol.ErrTLSRequired) {
		t.Errorf("plaintext client: %v, want ErrTLSRequired", err)
	}
	if _, err := Dial(ctx, plain.Addr, testCred, Options{TLS: good, Timeout: 2 * time.Second}); !errors.Is(err, protocol.ErrDonorLost) ||
		!strings.Contains(err.Error(), "does not speak TLS") {
		t.Errorf("TLS client, plaintext donor: %v", err)
	}
	if _, err := Dial(ctx, td.Addr, testCred, Options{TLS: memorytest.ClientTLS(t, other)}); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("client trusting another CA: %v", err)
	}
	wrongHost := good.Clone()
	wrongHost.ServerName = "10.9.9.9"
	if _, err := Dial(ctx, td.Addr, testCred, Options{TLS: wrongHost}); err == nil || !strings.Contains(err.Error(), "10.9.9.9") {
		t.Errorf("certificate for another host: %v", err)
	}
	if _, err := Dial(ctx, td.Addr, "wrong-credential", Options{TLS: good}); !errors.Is(err, protocol.ErrAuth) {
		t.Errorf("wrong credential over TLS: %v", err)
	}

	// An expired donor certificate.
	iss, err := ca.Issue(pki.Request{CommonName: "donor", Hosts: []string{"127.0.0.1"}, Usage: pki.ServerAuth, Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := iss.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	expired := memorytest.StartTLS(t, &tls.Config{Certificates: []tls.Certificate{cert}}, 1<<20, 0)
	late := good.Clone()
	late.Time = func() time.Time { return time.Now().Add(time.Hour) }
	if _, err := Dial(ctx, expired.Addr, testCred, Options{TLS: late}); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired donor certificate: %v", err)
	}
}

// TestRejoinHandoffNamesGivenUpConnection: over TLS a mapping's fault
// handler completes its connections itself (Handoff). A new connection
// that replaces one of the same session (Following.RejoinHandoff, the
// region where it was) carries the old one's id in its handoff
// (Replaces), its HELLO names it, and the donor ends the old connection
// before it answers; a connection named from another session (one the
// session followed the region from) is not named, and the connection of
// that id here serves on.
func TestRejoinHandoffNamesGivenUpConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ca := memorytest.NewCA(t)
	td := memorytest.StartTLS(t, memorytest.ServerTLS(t, ca), 1<<20, 0)
	here := func(context.Context) (string, string, error) { return td.Addr, testCred, nil }
	f, err := DialFollowing(ctx, td.Addr, testCred, Options{TLS: memorytest.ClientTLS(t, ca)}, FollowConfig{Relocate: here})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// complete does what the handler does with a handoff.
	complete := func(conn net.Conn, h Handoff) (*tls.Conn, ConnRef) {
		t.Helper()
		tc := tls.Client(conn, h.TLSConfig())
		t.Cleanup(func() { tc.Close() })
		if err := tc.HandshakeContext(ctx); err != nil {
			t.Fatal(err)
		}
		id, err := Hello(tc, h.Hello, h.Replaces)
		if err != nil {
			t.Fatal(err)
		}
		return tc, ConnRef{Session: h.Hello.Session, ID: id}
	}
	ping := func(c net.Conn) error {
		var b [protocol.HeaderSize]byte
		h := protocol.Header{Op: protocol.OpPing, Seq: 7}
		h.Encode(b[:])
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(b[:]); err != nil {
			return err
		}
		_, err := protocol.ReadFrame(c, b[:], nil)
		return err
	}
	conn, h, err := f.DialHandoff(ctx, protocol.KindFault)
	if err != nil {
		t.Fatal(err)
	}
	first, ref := complete(conn, h)
	if ref.ID == 0 {
		t.Fatal("the donor gave the connection no id")
	}

	other := ConnRef{Session: ref.Session ^ 2, ID: ref.ID}
	conn, h, err = f.RejoinHandoff(ctx, protocol.KindFault, other)
	if err != nil {
		t.Fatal(err)
	}
	if h.Replaces != 0 {
		t.Fatalf("a connection of another session named: replaces %d", h.Replaces)
	}
	complete(conn, h)
	if err := ping(first); err != nil {
		t.Fatalf("the connection of that id in this session: %v", err)
	}

	conn, h, err = f.RejoinHandoff(ctx, protocol.KindFault, ref)
	if err != nil {
		t.Fatal(err)
	}
	if h.Replaces != ref.ID {
		t.Fatalf("replaces %d, want %d", h.Replaces, ref.ID)
	}
	_, nref := complete(conn, h)
	if nref.ID == ref.ID || nref.Session != ref.Session {
		t.Fatalf("the new connection %+v, the old %+v", nref, ref)
	}
	if err := ping(first); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the replaced connection after the new one was answered: %v, want its end", err)
	}
}
