package mapping

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/memory/client"
	"github.com/rialto-project/rialto/internal/dataplane/memory/memorytest"
)

// TestHandlerGetsNoSecretEnv: the fault handler of a program that keeps
// RIALTO_TOKEN in its environment (only rialto's main takes it out) does
// not inherit it; it is given HandlerEnv alone of Rialto's variables.
func TestHandlerGetsNoSecretEnv(t *testing.T) {
	_, addr := memorytest.StartChild(t, 1<<20)
	c := dial(t, addr, client.Options{})
	t.Setenv("RIALTO_TOKEN", "rat_handler-child-env-0123456789")
	t.Setenv("MAPPING_CHILDENV_KEPT", "yes")
	m := mapOrSkip(t, c, Options{})
	defer func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	}()
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", m.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	vars := bytes.Split(env, []byte{0})
	has := func(prefix string) bool {
		for _, v := range vars {
			if bytes.HasPrefix(v, []byte(prefix)) {
				return true
			}
		}
		return false
	}
	if !has("MAPPING_CHILDENV_KEPT=yes") || !has(HandlerEnv+"=") {
		t.Fatalf("not the handler's environment (no MAPPING_CHILDENV_KEPT or %s): %q", HandlerEnv, env)
	}
	if has("RIALTO_TOKEN=") {
		t.Errorf("the fault handler inherited RIALTO_TOKEN: %q", env)
	}
}
