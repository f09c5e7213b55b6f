package controlplane

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestJoinCredentialBounds: a join presents at most
// api.MaxPreviousCredentials previous credentials, none empty, each and
// its credential at most api.MaxCredentialLen bytes; beyond, it is
// refused (400) and registers nothing. Within them, a join with the
// node's credential among its previous ones rejoins as the node (a
// database restored from a backup older than the agent's last join),
// and one with none of them is refused while the node is live (409).
func TestJoinCredentialBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j1, _ := e.join("n1", 1<<30)
	long := "rnc_" + strings.Repeat("x", api.MaxCredentialLen)
	prev := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = "rnc_earlier" + strings.Repeat("y", i)
		}
		return out
	}
	for _, c := range []struct {
		what string
		cred string
		prev []string
	}{
		{"too many previous credentials", "", prev(api.MaxPreviousCredentials + 1)},
		{"an empty previous credential", "", []string{"rnc_a", ""}},
		{"a previous credential too long", "", []string{long}},
		{"a credential too long", long, nil},
		{"the node's credential among too many previous ones", "", append(prev(api.MaxPreviousCredentials), j1.Credential)},
	} {
		req := joinRequest("n1", c.cred, 1<<30)
		req.PreviousCredentials = c.prev
		if _, err := e.boot.Join(e.ctx(), req); !api.IsCode(err, api.CodeInvalid) {
			t.Fatalf("%s: %v", c.what, err)
		}
	}
	req := joinRequest("n1", "rnc_unknown", 1<<30)
	req.PreviousCredentials = prev(api.MaxPreviousCredentials)
	if _, err := e.boot.Join(e.ctx(), req); !api.IsCode(err, api.CodeConflict) {
		t.Fatalf("a join with none of the node's credentials: %v", err)
	}
	req.PreviousCredentials = append(prev(api.MaxPreviousCredentials - 1)[1:], j1.Credential)
	jr, err := e.boot.Join(e.ctx(), req)
	if err != nil || jr.NodeID != j1.NodeID {
		t.Fatalf("a join with the node's credential among its previous ones: %v %+v", err, jr.NodeID)
	}
	if len(jr.LostLeases) != 0 {
		t.Fatalf("the proven rejoin lost %d leases", len(jr.LostLeases))
	}
}
