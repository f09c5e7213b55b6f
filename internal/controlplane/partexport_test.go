package controlplane

import (
	"strings"
	"testing"
)

// TestPartExportNames: each part of a lease gets an export name of its own,
// derived from the lease credential; no name contains the credential, an
// index or a prefix of another part's name, so the lender of one part
// cannot derive the name of another. The same credential, index and
// placement give the same name (a restarted lender and the borrower
// agree); each placement of a lease (placed again after lenders that did
// not confirm) has names of its own, so that a lender sent a name in one
// round learns none a later one serves.
func TestPartExportNames(t *testing.T) {
	t.Parallel()
	creds := []string{"rlc_aaaa", "rlc_aaab"}
	seen := map[string]string{}
	for _, cred := range creds {
		for n := range 8 * 3 {
			i, placement := n%8, 1+n/8
			name := partExport(cred, i, placement)
			if name != partExport(cred, i, placement) {
				t.Fatalf("%s part %d placement %d: not deterministic", cred, i, placement)
			}
			if strings.Contains(name, cred) || strings.Contains(name, strings.TrimPrefix(cred, "rlc_")) {
				t.Fatalf("part %d's name contains the credential", i)
			}
			if len(name) != len("rlp_")+43 || !strings.HasPrefix(name, "rlp_") {
				t.Fatalf("name %q: want rlp_ and 43 base64url characters", name)
			}
			if strings.ContainsAny(name[4:], "+/=.") {
				t.Fatalf("name %q is not base64url", name)
			}
			key := cred + "/" + string(rune('0'+i)) + "/" + string(rune('0'+placement))
			for other, k := range seen {
				if other == name {
					t.Fatalf("%s and %s share a name", k, key)
				}
				if other[:12] == name[:12] {
					t.Fatalf("%s and %s share a 12-character prefix", k, key)
				}
			}
			seen[name] = key
		}
	}
}
