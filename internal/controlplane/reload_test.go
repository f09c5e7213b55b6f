package controlplane

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store/postgres"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
	"github.com/rialto-project/rialto/internal/resource"
)

var (
	_ TokenReplacer = (*sqlite.Store)(nil)
	_ TokenReplacer = (*postgres.Store)(nil)
)

// TestReload: Reload swaps tokens and quotas in a running control plane.
// A token taken out stops working at once (even one cached a moment
// before), a new one works, a lowered quota refuses new leases but leaves
// the leases held untouched, and settings it refuses change nothing. The
// log line names no secret.
func TestReload(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	e := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.Quotas = Quotas{Default: Quota{Leases: 3}}
	})
	e.join("n1", 1<<30)
	small := api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20}
	var held []api.Lease
	for i := 0; i < 2; i++ {
		l, err := e.alice.CreateLease(e.ctx(), small)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	if _, err := e.bob.Leases(e.ctx()); err != nil { // bob's token is now cached
		t.Fatal(err)
	}

	const carolTok = "carol-secret-token"
	next := Settings{
		BootstrapToken: bootTok,
		Tokens:         []Token{{Token: aliceTok, Tenant: "alice"}, {Token: carolTok, Tenant: "carol"}, {Token: adminTok, Tenant: "ops", Admin: true}},
		Quotas:         Quotas{Default: Quota{Leases: 1}, Tenants: map[string]Quota{"carol": {Leases: 5}}},
	}
	if err := e.srv.Reload(e.ctx(), next); err != nil {
		t.Fatal(err)
	}
	_, err := e.bob.Leases(e.ctx())
	wantCode(t, err, http.StatusUnauthorized, "unknown or revoked token")
	carol := e.alice.WithToken(carolTok)
	for i := 0; i < 2; i++ {
		if _, err := carol.CreateLease(e.ctx(), small); err != nil {
			t.Fatalf("carol's lease %d: %v", i, err)
		}
	}
	// alice holds 2 leases over her new default quota of 1: she keeps
	// them, active, and gets no third.
	_, err = e.alice.CreateLease(e.ctx(), small)
	wantQuota(t, err, "tenant alice holds 2 of 1 leases")
	for _, l := range held {
		got, err := e.alice.Lease(e.ctx(), l.ID)
		if err != nil || got.State != api.LeaseActive || got.URI != l.URI {
			t.Fatalf("lease %s after reload: %v %+v", l.ID, err, got)
		}
	}

	// Refused settings change nothing.
	for _, bad := range []Settings{
		{BootstrapToken: bootTok, Tokens: []Token{{Token: carolTok, Tenant: ""}}},
		{BootstrapToken: bootTok, Tokens: []Token{{Token: bootTok, Tenant: "mallory"}}},
		{BootstrapToken: bootTok, Tokens: []Token{{Token: carolTok, Tenant: "carol"}, {Token: carolTok, Tenant: "dave"}}},
	} {
		err := e.srv.Reload(e.ctx(), bad)
		if err == nil || !strings.Contains(err.Error(), "reload refused") || strings.Count(err.Error(), "controlplane:") != 1 {
			t.Fatalf("bad settings %+v: %v", bad, err)
		}
		if strings.Contains(err.Error(), carolTok) || strings.Contains(err.Error(), bootTok) {
			t.Fatalf("the error shows a secret: %v", err)
		}
	}
	if _, err := carol.CreateLease(e.ctx(), small); err != nil {
		t.Fatalf("carol after refused reloads: %v", err)
	}
	_, err = e.alice.CreateLease(e.ctx(), small)
	wantQuota(t, err, "tenant alice holds 2 of 1 leases")

	// Without a bootstrap token nobody joins.
	if err := e.srv.Reload(e.ctx(), Settings{Tokens: next.Tokens, Quotas: next.Quotas}); err != nil {
		t.Fatal(err)
	}
	_, err = e.boot.Join(e.ctx(), api.JoinRequest{Name: "n2", Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
		Fingerprint: api.Fingerprint{MachineID: "mid-n2", Hostname: "n2", Cores: 2, MemoryBytes: 1 << 30}})
	wantCode(t, err, http.StatusUnauthorized, "unknown or revoked token")

	out := logs.String()
	if !strings.Contains(out, "settings reloaded") {
		t.Fatalf("no reload log line:\n%s", out)
	}
	// The bootstrap token by its fingerprint, the one an agent refused
	// with another token is told of its own: an operator rotating it
	// checks which one each side holds.
	for _, w := range []string{"bootstrap_token=" + resource.Fingerprint(bootTok), "bootstrap_token=none"} {
		if !strings.Contains(out, w) {
			t.Errorf("the reload log does not say %q:\n%s", w, out)
		}
	}
	for _, s := range []string{aliceTok, bobTok, carolTok, adminTok, bootTok} {
		if strings.Contains(out, s) {
			t.Fatalf("the log shows a token:\n%s", out)
		}
	}
}

// TestRestartRevokesRemovedTokens: tokens are the configuration's, also
// across a restart on the same database: one no longer configured stops
// working.
func TestRestartRevokesRemovedTokens(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	st, err := sqlite.Open(e.ctx(), e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := New(e.ctx(), Config{Store: st, Clock: e.clock, Lender: e.lender, BootstrapToken: bootTok,
		Tokens: []Token{{Token: aliceTok, Tenant: "alice"}}})
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]bool{aliceTok: true, bobTok: false, adminTok: false, bootTok: true} {
		_, err := srv.st.LookupToken(e.ctx(), resource.HashSecret(tok))
		if (err == nil) != want {
			t.Errorf("token of %s after restart: %v, want found=%v", tok, err, want)
		}
	}
}
