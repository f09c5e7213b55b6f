package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/borrower"
	"github.com/rialto-project/rialto/internal/pki"
	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestAttachTakesRevocationList: a running `rialto attach` of a block
// lease, given its own copy of the cluster's ca-cert.pem (--cacert) and
// no ca-crl.pem beside it, refuses its lender once the cluster CA revoked
// the lender's certificate, with no one copying the list to it: it takes
// the list from the control plane at a --watch (GET /v1/ca-certificates,
// crl_number), records its number in its state file, and its next redial
// of the lender, which keeps running and serving with the revoked
// certificate, fails the TLS handshake, so that reads through its export
// fail. Before, attach read only the ca-crl.pem beside --cacert: the
// redial verified, and the revoked lender went on serving it.
//
// The certificate is revoked in the CA directory by another process (as
// docs/operations.md allows; the control plane takes it at its next
// sweep), not by `rialto node remove`: a removal loses the node's leases,
// and attach would detach at the very watch at which it takes the list.
// The lender's heartbeats are paused, as a lender the control plane no
// longer hears would be: a heartbeat with the revoked certificate is
// refused, and the agent would join again with a new one. A redial is
// made by cutting attach's connections to the lender (shutdown(2) of
// their sockets, as a network reset would), the lender still serving.
func TestAttachTakesRevocationList(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{TLS: true, Nodes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := c.Client().CreateLease(ctx, api.LeaseRequest{Kind: api.KindBlock, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	nc, state, logs := attachWithCACopyLog(ctx, t, c, l.ID)
	if _, err := os.Stat(filepath.Join(filepath.Dir(state), pki.CRLFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a revocation list lies in the attachment's runtime directory: %v", err)
	}
	before := bytes.Repeat([]byte("written before the revocation "), 1024)
	if _, err := nc.WriteAtContext(ctx, before, 8192, true); err != nil {
		t.Fatal(err)
	}
	uris, err := borrower.BlockURIs(c.Lease(l.ID))
	if err != nil || len(uris) != 1 {
		t.Fatalf("the lease's URIs: %q, %v", uris, err)
	}
	u, err := url.Parse(uris[0])
	if err != nil {
		t.Fatal(err)
	}
	lender := c.Nodes[0]
	leaf := agentLeaf(ctx, t, c, lender.ID())

	lender.PauseHeartbeats(true)
	revoker, err := pki.Load(c.CA.Dir(), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := revoker.Revoke(leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	c.Sweep() // the control plane takes the directory's list
	num := c.CA.CRLNumber().Int64()
	if !c.CA.Revoked(leaf.SerialNumber) || num == 0 {
		t.Fatalf("the control plane did not take the revocation (list %d)", num)
	}
	testcluster.Eventually(t, 30*time.Second, "attach records the control plane's revocation list in its state file", func() bool {
		return attachStateOf(t, state).CRLNumber >= num
	})
	if _, err := os.Stat(filepath.Join(filepath.Dir(state), pki.CRLFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a revocation list lies in the attachment's runtime directory: %v", err)
	}
	if got := c.Lease(l.ID).State; got != api.LeaseActive {
		t.Fatalf("the lease is %s, want active", got)
	}
	if !lender.Serves(l.ID) {
		t.Fatal("the lender no longer serves the lease")
	}

	if n := cutConnsTo(t, u.Host); n == 0 {
		t.Fatalf("attach holds no connection to the lender at %s", u.Host)
	}
	got := make([]byte, len(before))
	_, err = nc.ReadAt(got, 8192)
	if err == nil {
		t.Fatalf("a read through the attachment was answered by the revoked lender (bytes intact: %v)", bytes.Equal(got, before))
	}
	if !strings.Contains(logs.String(), pki.ErrRevoked.Error()) {
		t.Fatalf("the read failed (%v), but attach's log does not say the lender's certificate is revoked:\n%s", err, logs.String())
	}
	if !lender.Serves(l.ID) {
		t.Fatal("the lender no longer serves the lease")
	}
}

// agentLeaf is the certificate node id's agent presents (its node
// certificate, which its data planes serve too).
func agentLeaf(ctx context.Context, t *testing.T, c *testcluster.Cluster, id string) *x509.Certificate {
	t.Helper()
	node, err := c.Client().Node(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(node.AgentURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", u.Host, c.CA.ClientConfig(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// cutConnsTo shuts down (shutdown(2), both ways) every TCP connection of
// this process to addr (host:port), as a network reset would: their
// owners see them end and, a borrower, redial. The sockets stay open
// (their owners close them). It returns how many it cut.
func cutConnsTo(t *testing.T, addr string) int {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	ip := net.ParseIP(host)
	p, err := strconv.Atoi(port)
	if err != nil || ip == nil {
		t.Fatalf("address %q: want ip:port", addr)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	cut := 0
	for _, e := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := syscall.Getpeername(fd)
		if err != nil {
			continue
		}
		var peerIP net.IP
		var peerPort int
		switch a := sa.(type) {
		case *syscall.SockaddrInet4:
			peerIP, peerPort = a.Addr[:], a.Port
		case *syscall.SockaddrInet6:
			peerIP, peerPort = a.Addr[:], a.Port
		default:
			continue
		}
		if peerPort == p && peerIP.Equal(ip) && syscall.Shutdown(fd, syscall.SHUT_RDWR) == nil {
			cut++
		}
	}
	return cut
}
