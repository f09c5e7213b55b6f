package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// tokenReplacer is the optional capability controlplane.TokenReplacer.
type tokenReplacer interface {
	ReplaceTokens(ctx context.Context, ts []store.Token) error
}

// testReplaceTokens: ReplaceTokens leaves exactly the given tokens, keeps
// the creation time of those already stored and takes their new tenant
// and admin flag.
func testReplaceTokens(t *testing.T, o Options) {
	s := open(t, o)
	r, ok := s.(tokenReplacer)
	if !ok {
		t.Skip("the store cannot replace its tokens")
	}
	ctx := context.Background()
	t0 := time.Unix(1700000000, 0).UTC()
	if err := s.PutToken(ctx, store.Token{Hash: "h-old", Kind: store.TokenTenant, Tenant: "old", CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := r.ReplaceTokens(ctx, []store.Token{
		{Hash: "h-boot", Kind: store.TokenBootstrap, CreatedAt: t0},
		{Hash: "h-alice", Kind: store.TokenTenant, Tenant: "alice", CreatedAt: t0},
	}); err != nil {
		t.Fatal(err)
	}
	t1 := t0.Add(time.Hour)
	if err := r.ReplaceTokens(ctx, []store.Token{
		{Hash: "h-alice", Kind: store.TokenTenant, Tenant: "alice", Admin: true, CreatedAt: t1},
		{Hash: "h-bob", Kind: store.TokenTenant, Tenant: "bob", CreatedAt: t1},
	}); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"h-old", "h-boot"} {
		if _, err := s.LookupToken(ctx, gone); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("token %s after the replacement: %v", gone, err)
		}
	}
	a, err := s.LookupToken(ctx, "h-alice")
	if err != nil || a.Tenant != "alice" || !a.Admin || !a.CreatedAt.Equal(t0) {
		t.Errorf("alice's token: %v %+v", err, a)
	}
	b, err := s.LookupToken(ctx, "h-bob")
	if err != nil || b.Tenant != "bob" || !b.CreatedAt.Equal(t1) {
		t.Errorf("bob's token: %v %+v", err, b)
	}
	if err := r.ReplaceTokens(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LookupToken(ctx, "h-bob"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("bob's token after an empty replacement: %v", err)
	}
}
