package controlplane

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestCheckAgentVersion: the control plane accepts agents of its own and
// the previous minor version, and none else, naming both versions when it
// refuses.
func TestCheckAgentVersion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		server, agent string
		err           string // "" accepted, else a part of the refusal
	}{
		{"v1.5.2", "v1.5.0", ""},
		{"v1.5.2", "v1.5.9", ""},
		{"v1.5.2", "v1.4.7", ""},
		{"v1.5.0", "v1.4.0-rc.1", ""},
		{"1.5.0", "1.4.3+deb12", ""},
		{"v1.0.0", "v1.0.0", ""},
		{"v1.5.2", "v1.3.9", "agent version v1.3.9 is too old for the control plane's v1.5.2, which accepts agents of v1.5 and v1.4"},
		{"v1.5.2", "v1.6.0", "agent version v1.6.0 is newer than the control plane's v1.5.2: upgrade the control plane first"},
		{"v2.0.0", "v1.9.0", "agent version v1.9.0 is another major version than the control plane's v2.0.0"},
		{"v1.0.0", "v2.0.0", "another major version"},
		{"v1.0.0", "v0.9.0", "another major version"},
		// Nothing to compare: accepted.
		{"v1.5.2", "", ""},
		{"v1.5.2", "devel", ""},
		{"devel", "v0.1.0", ""},
		{"", "v9.9.9", ""},
		{"v1.5.2", "v0.0.0-20261126034127-abcdef012345", ""},
		{"v1.5.2", "v1.5", ""},
		{"v1.5.2", "v1.x.0", ""},
	} {
		err := CheckAgentVersion(c.server, c.agent)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("server %q agent %q: refused: %v", c.server, c.agent, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, ErrInvalid)):
			t.Errorf("server %q agent %q: got %v, want a refusal with %q", c.server, c.agent, err, c.err)
		}
	}
}

// TestJoinVersion: through the API, a control plane of v1.5.2 lets agents
// of v1.5 and v1.4 join and heartbeat, and refuses older or newer ones
// with 400 naming both versions, at join and at heartbeat.
func TestJoinVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.Version = "v1.5.2" })
	join := func(name, version string) (api.JoinResponse, error) {
		return e.boot.Join(e.ctx(), api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1", Version: version,
			Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30}})
	}
	for _, c := range []struct {
		version string
		ok      bool
	}{
		{"v1.5.0", true}, {"v1.4.9", true}, {"", true},
		{"v1.3.0", false}, {"v1.6.0", false}, {"v2.5.2", false},
	} {
		name := "n-" + strings.NewReplacer(".", "-").Replace(c.version)
		jr, err := join(name, c.version)
		if !c.ok {
			wantCode(t, err, http.StatusBadRequest, "agent version "+c.version, "control plane's v1.5.2")
			continue
		}
		if err != nil {
			t.Fatalf("agent %q: %v", c.version, err)
		}
		node := e.boot.WithToken(jr.Credential)
		if _, err := node.Heartbeat(e.ctx(), jr.NodeID, api.Heartbeat{Health: "ok", Version: c.version}); err != nil {
			t.Fatalf("heartbeat of agent %q: %v", c.version, err)
		}
		// The same node, its agent replaced by a too old one without
		// joining again: its heartbeats are refused.
		_, err = node.Heartbeat(e.ctx(), jr.NodeID, api.Heartbeat{Health: "ok", Version: "v1.2.0"})
		wantCode(t, err, http.StatusBadRequest, "agent version v1.2.0 is too old for the control plane's v1.5.2")
	}
}
