package testcluster

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/agent"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// derivedNames are the export names a holder of the secrets given could
// compute the way the control plane names parts (an HMAC of a secret per
// part index and placement) or named them before (the secret and the
// part's index), each secret also taken as a name itself.
func derivedNames(secrets []string, parts int) []string {
	var out []string
	for _, s := range secrets {
		out = append(out, s, "rlp_"+s)
		for i := range parts {
			for _, sep := range []string{".", "/", "-", "_", ""} {
				out = append(out, s+sep+strconv.Itoa(i))
			}
			for placement := 1; placement <= 2; placement++ {
				m := hmac.New(sha256.New, []byte(s))
				m.Write([]byte("part/" + strconv.Itoa(i)))
				if placement > 1 {
					m.Write([]byte("/placement/" + strconv.Itoa(placement)))
				}
				out = append(out, "rlp_"+base64.RawURLEncoding.EncodeToString(m.Sum(nil)))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// exportLike finds the strings of b that could be export names or
// secrets: runs of URL-safe base64 of 20 characters or more.
var exportLike = regexp.MustCompile(`[A-Za-z0-9_-]{20,}`)

// TestLenderCannotOpenOtherParts: the lender of part 0 of a 3-way
// composed lease, with everything it legitimately has — its state dir
// (identity with its node credential and agent key, node certificate and
// key, exports record), its node credential on the control plane's API
// and its certificate on the peers' agent APIs and data planes — learns
// no other part's export name or the lease's credential, and opens
// neither other part: not with any name it has or could derive, not by
// listing the other lenders' exports, not through the control plane (a
// node credential reads no lease, and nothing it may read holds a part's
// name), not through the other lenders' agent APIs. The borrower's URIs
// open every part.
func TestLenderCannotOpenOtherParts(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{TLS: true, Tenants: []string{"alice"},
		Devices: []agent.DeviceConfig{{Name: "disk0", Kind: api.KindBlock, Path: "disk0.img", Size: 8 << 20}}})
	ctx := ctxT(t)
	l, err := c.ClientWithToken(TenantToken("alice")).CreateLease(ctx,
		api.LeaseRequest{Kind: api.KindBlock, Mode: api.ModeComposed, Count: 3, Size: 24 << 20})
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(l.Parts))
	for i, p := range l.Parts {
		u, err := nbd.ParseURI(p.URI)
		if err != nil {
			t.Fatal(err)
		}
		names[i] = u.Export
	}
	secret := func(b []byte) string { // what of the lease's secrets b holds, if any
		for i, n := range names[1:] {
			if bytes.Contains(b, []byte(n)) {
				return fmt.Sprintf("part %d's export name", i+1)
			}
		}
		if bytes.Contains(b, []byte(l.Credential)) {
			return "the lease credential"
		}
		return ""
	}
	lender := c.NodeByID(l.Parts[0].NodeID)
	for j, p := range l.Parts[1:] {
		if p.NodeID == lender.ID() {
			t.Fatalf("part %d is on part 0's lender too", j+1)
		}
	}

	// Its state dir: nothing of the other parts, and the secrets it
	// holds to derive names from.
	held := []string{names[0], l.ID}
	err = filepath.WalkDir(lender.StateDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if what := secret(b); what != "" {
			t.Errorf("part 0's lender holds %s in %s", what, filepath.Base(path))
		}
		if ext := filepath.Ext(path); ext != ".img" && ext != ".pem" { // the certificate is tried below
			for _, m := range exportLike.FindAll(b, -1) {
				held = append(held, string(m))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var id struct {
		NodeID     string `json:"node_id"`
		Credential string `json:"credential"`
		AgentKey   string `json:"agent_key"`
	}
	b, err := os.ReadFile(filepath.Join(lender.StateDir, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &id); err != nil || id.Credential == "" || id.AgentKey == "" {
		t.Fatalf("the lender's identity: %v", err)
	}
	cert := nodeCert(t, lender)
	var seen []string // what the control plane's answers hold, tried as names as they are
	withCert := dataTLS(t, c)
	withCert.Certificates = []tls.Certificate{cert}

	// The control plane, with its node credential over mutual TLS.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: withCert}}
	call := func(method, path string, body any) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, c.URL+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+id.Credential)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out
	}
	other := c.NodeByID(l.Parts[1].NodeID).ID()
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/leases/" + l.ID},
		{"GET", "/v1/leases"},
		{"GET", "/v1/leases?state=active"},
		{"GET", "/v1/moves?lease=" + l.ID},
		{"POST", "/v1/leases/" + l.ID + "/renew"},
		{"POST", "/v1/nodes/" + other + "/heartbeat"},
	} {
		var body any
		if r.method == "POST" {
			body = map[string]any{}
		}
		status, out := call(r.method, r.path, body)
		if status != http.StatusUnauthorized && status != http.StatusForbidden && status != http.StatusNotFound {
			t.Errorf("%s %s with part 0's lender's node credential: %d, want it refused", r.method, r.path, status)
		}
		if what := secret(out); what != "" {
			t.Errorf("%s %s gives part 0's lender %s", r.method, r.path, what)
		}
	}
	for _, path := range []string{"/v1/nodes", "/v1/nodes/" + other, "/v1/devices", "/v1/topology", "/v1/events",
		"/v1/usage", "/v1/metrics-targets", "/v1/profiles", "/v1/whoami"} {
		status, out := call("GET", path, nil)
		if status != http.StatusOK {
			t.Errorf("GET %s with a node credential: %d (the readers' routes: update this list)", path, status)
		}
		if what := secret(out); what != "" {
			t.Errorf("GET %s gives part 0's lender %s", path, what)
		}
		for _, m := range exportLike.FindAll(out, -1) {
			seen = append(seen, string(m))
		}
	}

	// The other lenders' agent APIs, with its certificate and keys.
	for j := 1; j < len(l.Parts); j++ {
		n := c.NodeByID(l.Parts[j].NodeID)
		base := n.Agent().AgentURL()
		for _, key := range []string{id.AgentKey, id.Credential} {
			for _, r := range []struct {
				method, path string
				body         any
			}{
				{"GET", "/agent/v1/status", nil},
				{"GET", "/agent/v1/transfers", nil},
				{"POST", "/agent/v1/transfers/out", api.TransferOutRequest{LeaseID: l.ID}},
				{"POST", "/agent/v1/prepare", api.PrepareRequest{LeaseID: l.ID, Kind: api.KindBlock, DeviceName: "disk0",
					Offset: l.Parts[j].Offset, Length: l.Parts[j].Length, Export: names[0]}},
			} {
				var rd io.Reader
				if r.body != nil {
					b, _ := json.Marshal(r.body)
					rd = bytes.NewReader(b)
				}
				req, err := http.NewRequestWithContext(ctx, r.method, base+r.path, rd)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatalf("%s %s of part %d's lender: %v", r.method, r.path, j, err)
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s %s of part %d's lender with part 0's lender's certificate: %d, want 401 or 403", r.method, r.path, j, resp.StatusCode)
				}
				if what := secret(out); what != "" {
					t.Errorf("%s %s of part %d's lender gives part 0's lender %s", r.method, r.path, j, what)
				}
			}
		}
	}

	// The other parts' data planes, with its certificate: every name it
	// has or could derive is refused, as is a listing of the exports.
	held = append(held, id.NodeID, id.Credential, id.AgentKey, base64.RawURLEncoding.EncodeToString(cert.Certificate[0]))
	guesses := append(derivedNames(held, len(l.Parts)), seen...)
	slices.Sort(guesses)
	guesses = slices.Compact(guesses)
	t.Logf("%d names tried on each other part's data plane", len(guesses))
	for j := 1; j < len(l.Parts); j++ {
		u, err := nbd.ParseURI(l.Parts[j].URI)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range guesses {
			if g == names[j] {
				t.Fatalf("part 0's lender derived part %d's export name", j)
			}
			u.Export = g
			nc, err := u.Dial(ctx, withCert)
			if err == nil {
				nc.Close()
				t.Fatalf("part 0's lender opened part %d with a name it derived", j)
			}
			if !errors.Is(err, nbd.ErrExportNotFound) {
				t.Fatalf("part %d's data plane did not answer a guess: %v", j, err)
			}
		}
	}
	if nbdinfo, err := exec.LookPath("nbdinfo"); err != nil {
		t.Log("nbdinfo not installed: no listing tried")
	} else {
		dir := t.TempDir() // libnbd's tls-certificates layout, with the node's certificate
		ca, err := os.ReadFile(c.CA.CertFile())
		if err != nil {
			t.Fatal(err)
		}
		for name, src := range map[string]string{"client-cert.pem": "node-cert.pem", "client-key.pem": "node-key.pem"} {
			b, err := os.ReadFile(filepath.Join(lender.StateDir, src))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "ca-cert.pem"), ca, 0o600); err != nil {
			t.Fatal(err)
		}
		for j := 1; j < len(l.Parts); j++ {
			u := mustURL(t, l.Parts[j].URI)
			list := "nbds://" + u.Host + "/?tls-certificates=" + dir
			out, err := exec.CommandContext(ctx, nbdinfo, "--list", list).CombinedOutput()
			if what := secret(out); what != "" {
				t.Fatalf("listing part %d's lender gives part 0's lender %s", j, what)
			}
			if err == nil {
				t.Errorf("part %d's lender listed its exports: %s", j, out)
			} else if !strings.Contains(string(out), "nbd_opt_list: server replied with error") {
				t.Errorf("listing part %d's lender failed for another reason than the refusal (%v): %s", j, err, out)
			}
		}
	}

	cfg := dataTLS(t, c)
	for i, uri := range partURIs(l) {
		u, err := nbd.ParseURI(uri)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := u.Dial(ctx, cfg)
		if err != nil {
			t.Fatalf("the borrower cannot open part %d: %v", i, err)
		}
		nc.Close()
	}
}
