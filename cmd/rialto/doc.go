// Command rialto is Rialto's one binary: the control plane (server), the
// node agent (agent), a whole local cluster (up) and the CLI verbs that
// talk to a control plane. Run `rialto help` for the list.
//
// The command tree is built with cobra (spf13/cobra) from the verbs each
// file registers from init; flags are pflag's (--name VALUE, -o).
package main
