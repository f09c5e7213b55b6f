package childenv

import (
	"os"
	"strings"
)

// Prefix starts the name of every variable Environ leaves out.
const Prefix = "RIALTO_"

// Environ is os.Environ without the variables whose name starts with
// Prefix, followed by extra ("KEY=value" each), which may set one of them
// by name for a child that needs it. It never returns nil, so an exec.Cmd
// given it does not fall back to the whole environment.
func Environ(extra ...string) []string {
	env := make([]string, 0, len(os.Environ())+len(extra))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, Prefix) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}
