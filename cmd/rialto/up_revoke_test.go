package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/pgserver"
)

// TestUpReplicasRevocation: with three replicas on PostgreSQL, `rialto
// node remove` returns only once every replica refuses the removed node:
// its credential and certificate, at the very next request, on a
// keep-alive connection each replica was already serving, and on a new
// one.
func TestUpReplicasRevocation(t *testing.T) {
	if _, err := pgserver.FindBin(); err != nil {
		t.Skip(err)
	}
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	t.Cleanup(func() {
		if pg, err := pgserver.Attach(filepath.Join(dir, "pg")); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pg.Stop(ctx, "immediate")
			pg.Remove()
		}
	})
	up := startUp(t, bin, dir, "--replicas", "3", "--agents", "1")
	addrs := strings.Split(up.Addr, ",")
	if len(addrs) != 3 {
		t.Fatalf("RIALTO_ADDR=%s", up.Addr)
	}
	var nodes []api.Node
	poll(t, "node1 ready", 30*time.Second, func() bool {
		up.cli(t, bin, &nodes, "nodes")
		return len(nodes) == 1 && nodes[0].State == api.NodeReady
	})
	id := nodes[0].ID
	// The node's credential and certificate, as its agent holds them.
	state := filepath.Join(dir, "node1")
	var ident struct {
		Credential string `json:"credential"`
	}
	b, err := os.ReadFile(filepath.Join(state, "identity.json"))
	if err == nil {
		err = json.Unmarshal(b, &ident)
	}
	if err != nil || ident.Credential == "" {
		t.Fatalf("the agent's identity: %v", err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(state, "node-cert.pem"), filepath.Join(state, "node-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(up.CACert)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := func() *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}, MaxIdleConnsPerHost: 1}}
	}
	// get asks base for the node with token on c; it reports the status (0
	// and the error when there is no answer) and whether the connection
	// was one already open.
	get := func(c *http.Client, base, token string) (status int, reused bool, err error) {
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/nodes/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			return 0, reused, err
		}
		io.Copy(io.Discard, resp.Body) // read to the end: the connection stays open
		resp.Body.Close()
		return resp.StatusCode, reused, nil
	}
	// On every replica, a connection presenting the node's certificate
	// and its credential: served, kept alive (the credential is now in
	// each replica's cache).
	byCred := make([]*http.Client, 3)
	for i, a := range addrs {
		byCred[i] = client()
		for k := 0; k < 2; k++ {
			if st, reused, err := get(byCred[i], a, ident.Credential); st != http.StatusOK || (k == 1 && !reused) {
				t.Fatalf("replica %s, the node's credential: %d reused=%v %v", a, st, reused, err)
			}
		}
	}

	// Removed through the first replica (its agent runs: --force).
	cmd := exec.Command(bin, "node", "remove", "--force", id)
	cmd.Env = up.Env()
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "certificate(s) revoked") {
		t.Fatalf("rialto node remove: %v\n%s", err, out)
	}
	// At once, on every replica: no polling.
	for i, a := range addrs {
		st, reused, err := get(byCred[i], a, ident.Credential)
		if st != http.StatusUnauthorized || !reused {
			t.Errorf("replica %s: the removed node's credential on its open connection: %d reused=%v %v", a, st, reused, err)
		}
		// A new connection is refused at the request (the handshake
		// takes the revoked certificate, so that an agent hears the 401
		// and joins again: controlplane.APIServerTLS).
		st, reused, err = get(client(), a, ident.Credential)
		if reused || err != nil || st != http.StatusUnauthorized {
			t.Errorf("replica %s: the removed node on a new connection: %d reused=%v %v", a, st, reused, err)
		}
	}
	// The rest of the cluster goes on: a client without the node's
	// certificate is served by every replica.
	plain := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	for _, a := range addrs {
		if st, _, err := get(plain, a, up.Token); st != http.StatusOK {
			t.Errorf("replica %s, a tenant token: %d %v", a, st, err)
		}
	}
	up.Stop(t)
}
