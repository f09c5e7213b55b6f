package ui_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/testcluster"
)

// TestSimulatorPage: the dashboard lists the simulator's experiments and
// shows one's plot and figures, each tagged fit or prediction beside the
// paper's value; an unknown experiment is a 404, and a signed-out visitor
// is sent to sign in.
func TestSimulatorPage(t *testing.T) {
	c := start(t)
	anon := newVisitor(t, c.URL)
	if resp, _ := anon.get("/ui/sim"); resp.StatusCode != http.StatusSeeOther && resp.StatusCode != http.StatusFound {
		t.Errorf("signed out: %d, want a redirect to sign in", resp.StatusCode)
	}
	v := newVisitor(t, c.URL)
	v.signIn(c.ClientWithToken(testcluster.TenantToken("alice")))
	resp, body := v.get("/ui/sim")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `href="/ui/sim/smufin-sharing"`) || !strings.Contains(body, `aria-current="page">Simulator`) {
		t.Fatalf("list: %d\n%s", resp.StatusCode, body)
	}
	resp, body = v.get("/ui/sim/smufin-sharing")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("experiment: %d\n%s", resp.StatusCode, body)
	}
	for _, want := range []string{"<svg", "Call et al.", "<td>prediction</td>", "<td>fit</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("the experiment's page lacks %q", want)
		}
	}
	if resp, _ := v.get("/ui/sim/no-such-experiment"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown experiment: %d, want 404", resp.StatusCode)
	}
}
