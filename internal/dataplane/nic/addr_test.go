package nic

import (
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
