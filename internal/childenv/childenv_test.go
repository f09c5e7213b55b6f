package childenv

import (
	"slices"
	"testing"
)

func TestEnviron(t *testing.T) {
	t.Setenv("RIALTO_TOKEN", "rat_secret")
	t.Setenv("RIALTO_DB", "postgres://u:pw@h/db")
	t.Setenv("CHILDENV_KEPT", "yes")
	t.Setenv("XRIALTO_KEPT", "yes")
	env := Environ("RIALTO_MEMORY_FAULT_HANDLER={}")
	for _, kv := range env {
		if kv == "RIALTO_TOKEN=rat_secret" || kv == "RIALTO_DB=postgres://u:pw@h/db" {
			t.Errorf("Environ kept %s", kv)
		}
	}
	for _, want := range []string{"CHILDENV_KEPT=yes", "XRIALTO_KEPT=yes", "RIALTO_MEMORY_FAULT_HANDLER={}"} {
		if !slices.Contains(env, want) {
			t.Errorf("Environ lost %s", want)
		}
	}
	if env[len(env)-1] != "RIALTO_MEMORY_FAULT_HANDLER={}" {
		t.Errorf("extra is not last: %q", env[len(env)-1])
	}
}
