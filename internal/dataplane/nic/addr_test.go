package nic

import (
	"fmt"
	"net/netip"
	"testing"
)

// TestLeaseAddr: a lease's address is derived from its ID alone, inside
// the pool: every lender of a bond computes the same one.
func TestLeaseAddr(t *testing.T) {
	seen := map[netip.Addr]bool{}
	for _, pool := range []netip.Prefix{DefaultPool, netip.MustParsePrefix("10.9.0.0/16"), netip.MustParsePrefix("192.168.7.0/24")} {
		for _, id := range []string{"lease-a", "lease-b", "lease-k3j9x2m1q8zz"} {
			a := LeaseAddr(pool, id)
			if !pool.Contains(a) || a != LeaseAddr(pool, id) {
				t.Fatalf("%s in %v: %v", id, pool, a)
			}
			seen[a] = true
		}
	}
	if len(seen) != 9 {
		t.Fatalf("%d distinct addresses for 9 (pool, lease) pairs", len(seen))
	}
}

// TestLeaseAddrUsable: a lease whose ID's first address would end in .255
// or .0 (or be the pool's first or last) still has an address of its own,
// one a borrower may have, the same at every lender. Before, LeaseAddr
// returned the unusable address and each lender picked a random one.
func TestLeaseAddrUsable(t *testing.T) {
	pool := DefaultPool
	size := uint32(1) << (32 - pool.Bits())
	found := 0
	for i := 0; found < 3 && i < 100000; i++ {
		id := fmt.Sprintf("lease-%d", i)
		if _, ok := poolAddr(pool, leaseOffset(id, size)); ok {
			continue
		}
		found++
		a := LeaseAddr(pool, id)
		if b := a.As4(); !pool.Contains(a) || b[3] == 0 || b[3] == 255 || a != LeaseAddr(pool, id) {
			t.Fatalf("%s: LeaseAddr %v, want a usable address of %v, the same each time", id, a, pool)
		}
		l := &Lender{cfg: LenderConfig{Pool: pool}}
		if got, err := l.freeAddr(id); err != nil || got != a {
			t.Fatalf("%s: a lender gives %v (%v), want the lease's own %v", id, got, err, a)
		}
	}
	if found == 0 {
		t.Fatal("no lease ID with an unusable first address found")
	}
}
