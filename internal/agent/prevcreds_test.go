package agent

import (
	"fmt"
	"slices"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestPreviousCredentialsBounded: each join that replaces the node
// credential puts the one it replaced first among the previous ones, and
// the agent keeps the last api.MaxPreviousCredentials of them, newest
// first, never the current one, an empty one or one twice.
func TestPreviousCredentialsBounded(t *testing.T) {
	t.Parallel()
	var cur string
	var prev []string
	for i := range 20 {
		next := fmt.Sprintf("rnc_%d", i)
		prev, cur = previousCredentials(cur, prev, next), next
		want := []string{}
		for k := i - 1; k >= 0 && len(want) < api.MaxPreviousCredentials; k-- {
			want = append(want, fmt.Sprintf("rnc_%d", k))
		}
		if !slices.Equal(prev, want) {
			t.Fatalf("after join %d: %v, want %v", i, prev, want)
		}
	}
	// A join answered with a credential already kept (not one the control
	// plane issues; the rule holds anyway), or presented twice.
	if got := previousCredentials("rnc_a", []string{"rnc_b", "rnc_a", "rnc_c"}, "rnc_c"); !slices.Equal(got, []string{"rnc_a", "rnc_b"}) {
		t.Fatalf("%v", got)
	}
}
