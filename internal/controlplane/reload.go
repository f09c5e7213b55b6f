package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

// Settings are what a running control plane takes anew on Reload (rialto
// server reloads them on SIGHUP): who may call it and how much each
// tenant may hold.
type Settings struct {
	BootstrapToken string // "": joining becomes impossible
	Tokens         []Token
	Quotas         Quotas
}

// TokenReplacer is a store that replaces its whole set of tokens in one
// transaction. With it, the tokens configured at New and Reload are the
// only ones that work: a token taken out of the configuration is revoked.
// Without it, tokens are only ever added.
type TokenReplacer interface {
	ReplaceTokens(ctx context.Context, ts []store.Token) error
}

// storedTokens checks the settings' tokens and returns them as stored; its
// errors say what is wrong, and the caller says where (start-up, reload).
func (s *Server) storedTokens(set Settings) ([]store.Token, error) {
	now := s.now()
	var out []store.Token
	seen := map[string]string{}
	if set.BootstrapToken != "" {
		h := resource.HashSecret(set.BootstrapToken)
		seen[h] = "the bootstrap token"
		out = append(out, store.Token{Hash: h, Kind: store.TokenBootstrap, CreatedAt: now})
	}
	for _, t := range set.Tokens {
		if t.Token == "" || t.Tenant == "" {
			return nil, errors.New("a tenant token needs a token and a tenant")
		}
		if t.Token == set.BootstrapToken {
			return nil, errors.New("a tenant token must differ from the bootstrap token")
		}
		h := resource.HashSecret(t.Token)
		if other, dup := seen[h]; dup && other != "tenant "+t.Tenant {
			// The same secret for two tenants: which one a call is
			// would depend on the order of the file.
			return nil, fmt.Errorf("a token of tenant %s (%s) is also %s", t.Tenant, resource.Fingerprint(t.Token), other)
		}
		seen[h] = "tenant " + t.Tenant
		out = append(out, store.Token{Hash: h, Kind: store.TokenTenant, Tenant: t.Tenant, Admin: t.Admin, CreatedAt: now})
	}
	return out, nil
}

// putTokens stores the tokens: in place of every stored one when the
// store is a TokenReplacer, else beside them.
func (s *Server) putTokens(ctx context.Context, ts []store.Token) error {
	if r, ok := s.st.(TokenReplacer); ok {
		return r.ReplaceTokens(ctx, ts)
	}
	for _, t := range ts {
		if err := s.st.PutToken(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// Reload replaces the control plane's tokens and quotas with set's, all
// or nothing: settings it refuses (a token without a tenant, the
// bootstrap token reused as a tenant's) change nothing. Leases are not
// touched: a tenant over a lowered quota keeps what it holds and is
// refused more until it is under. Tokens taken out stop working at once
// (with a TokenReplacer store). It logs what changed without a secret:
// counts, tenants and token fingerprints (the bootstrap token's too).
func (s *Server) Reload(ctx context.Context, set Settings) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	ts, err := s.storedTokens(set)
	if err != nil {
		return fmt.Errorf("controlplane: reload refused: %w", err)
	}
	if err := s.putTokens(ctx, ts); err != nil {
		return fmt.Errorf("controlplane: reload refused: store tokens: %w", err)
	}
	s.res.SetQuotas(set.Quotas)
	s.auth.dropTokens() // a removed token must not live on in the cache
	tenants := map[string]bool{}
	admins := 0
	fps := make([]string, 0, len(set.Tokens))
	for _, t := range set.Tokens {
		tenants[t.Tenant] = true
		if t.Admin {
			admins++
		}
		fps = append(fps, t.Tenant+"="+resource.Fingerprint(t.Token))
	}
	sort.Strings(fps)
	qt := make([]string, 0, len(set.Quotas.Tenants))
	for t := range set.Quotas.Tenants {
		qt = append(qt, t)
	}
	sort.Strings(qt)
	boot := "none" // no machine joins
	if set.BootstrapToken != "" {
		boot = resource.Fingerprint(set.BootstrapToken)
	}
	s.log.Info("settings reloaded", "tokens", len(set.Tokens), "admin_tokens", admins, "tenants", len(tenants),
		"token_fingerprints", fps, "bootstrap_token", boot,
		"default_quota", fmt.Sprintf("%+v", set.Quotas.Default), "quota_tenants", qt)
	return nil
}

// dropTokens forgets the entries of tenant and bootstrap tokens (node
// credentials stay: a reload does not change them).
func (c *authCache) dropTokens() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextGenLocked()
	for h, e := range c.m {
		if e.p.role == roleTenant || e.p.role == roleBootstrap {
			delete(c.m, h)
		}
	}
}
