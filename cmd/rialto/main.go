package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/rack"
)

// runFunc runs a verb with its positional arguments, once its flags
// (defined by the verb's Flags function) are parsed.
type runFunc func(ctx context.Context, pos []string) error

// command is one verb. A verb lives in its own file and registers itself
// from init with register.
type command struct {
	// Name is the verb as typed, possibly two words ("lease create").
	Name string
	// Args is the synopsis of positional arguments, e.g. "ID".
	Args    string
	Summary string
	// Help, when set, is printed by the verb's -h after Summary: what
	// the one line leaves out (an exit status of its own).
	Help string
	// Aliases are other names of the verb's last word.
	Aliases []string
	// Deprecated, when set, is printed (to stderr) when the verb is
	// called by one of its Aliases.
	Deprecated string
	// MinArgs and MaxArgs bound the number of positional arguments
	// (MaxArgs < 0: no bound).
	MinArgs, MaxArgs int
	// Flags defines the verb's flags on fs and returns the function that
	// runs it once they are parsed.
	Flags func(e *env, fs *pflag.FlagSet) runFunc
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.Name]; dup {
		panic("rialto: command registered twice: " + c.Name)
	}
	commands[c.Name] = c
}

// Help groups: what a verb is for.
const (
	groupDaemon = "daemon"
	groupClient = "client"
	groupTool   = "tool"
)

// groupOf places a top-level word in a help group.
func groupOf(word string) string {
	switch word {
	case "server", "agent", "appliance", "up":
		return groupDaemon
	case "characterize", "sim", "cost", "ca", "slurm", "version":
		return groupTool
	}
	return groupClient
}

// groupSummaries describe the two-word verbs' first words.
var groupSummaries = map[string]string{
	"lease":   "Create, show, renew, move and release leases.",
	"node":    "Cordon, uncordon, drain and remove nodes.",
	"profile": "Show or declare a device model's performance profile.",
	"ca":      "Manage the cluster CA of a TLS directory: show, rotate, drop-old.",
	"sim":     "List and run the simulator's experiments.",
	"slurm":   "Slurm hooks: prolog, task prolog and epilog.",
	"vm":      "Run, stop, list and move virtual machines on leased devices.",
	"accel":   "Run an accelerator lease's role.",
}

// env is what a verb may touch of the process, so tests can run verbs in
// process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// usageError is a mistake in the command line: rialto prints it on one
// line that ends with where to read the verb's help, and exits 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// usagef returns a usageError.
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// exitInfeasible is the exit status of explain (lease create --dry-run)
// when the plan it printed is infeasible: scripts tell it from a failure
// to get a plan (1).
const exitInfeasible = 3

// statusError ends a verb with an exit status other than 1: rialto prints
// err as it prints a failure's, and exits with status.
type statusError struct {
	status int
	err    error
}

func (s statusError) Error() string { return s.err.Error() }
func (s statusError) Unwrap() error { return s.err }

func main() {
	// A memory mapping's fault handler is this binary re-executed with the
	// hidden argument memory-fault-handler (docs/memory-protocol.md).
	mapping.RunFaultHandlerIfChild()
	// An emulated rack's reaper (`rialto up --netns`) is this binary with
	// the hidden argument rack-reaper (internal/rack).
	rack.RunReaperIfChild()
	// So is the reaper of `rialto up --replicas`, with the hidden argument
	// up-replicas-reaper (replicas.go).
	runReplicaReaperIfChild()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, getenv: withholdSecretEnv()})
	stop()
	os.Exit(code)
}

// run dispatches args to a verb and returns the exit code: 0, 1 for a
// failure, 2 for a usage mistake, or a verb's own (a statusError's:
// exitInfeasible).
func run(ctx context.Context, args []string, e *env) int {
	root := newRoot(e)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		fmt.Fprintf(e.stderr, "rialto: %s%s; see '%s -h'\n", oneLine(err.Error()), pskHint(err), cmd.CommandPath())
		return 2
	}
	printError(e.stderr, cmd.CommandPath(), err)
	var se statusError
	if errors.As(err, &se) {
		return se.status
	}
	return 1
}

// isCobraUsage recognises the errors cobra returns for command lines it
// cannot parse before any verb runs.
func isCobraUsage(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "unknown command ") || strings.HasPrefix(s, "unknown flag") ||
		strings.HasPrefix(s, "unknown shorthand flag") || strings.HasPrefix(s, "invalid argument ") ||
		strings.Contains(s, "flag needs an argument") || strings.HasPrefix(s, "required flag")
}

// pskHint answers a flag asking for TLS with a pre-shared key (nbdkit's
// --tls-psk, libnbd's tls-psk-file) where there is none: only the
// agent's NBD server takes pre-shared keys.
func pskHint(err error) string {
	if s := err.Error(); !strings.HasPrefix(s, "unknown flag") || !strings.Contains(strings.ToLower(s), "psk") {
		return ""
	}
	return " (TLS with a pre-shared key is served to NBD clients by `rialto agent --tls-psk FILE`; " +
		"everything else uses certificates of the cluster CA, docs/operations.md \"TLS and the trust model\")"
}

// oneLine keeps the first line of a message (cobra appends suggestions).
func oneLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// printError prints err of the verb at path ("rialto lease create").
func printError(w io.Writer, path string, err error) {
	var ae *api.Error
	if errors.As(err, &ae) {
		fmt.Fprintf(w, "rialto: error: %s (code %s, HTTP %d)%s%s%s\n", ae.Message, ae.Code, ae.Status, notFoundHint(ae), apiHint(ae, path), infeasibleHint(ae, path))
		return
	}
	hint := ""
	if errors.Is(err, syscall.ECONNREFUSED) {
		// Most often RIALTO_ADDR is not set in this shell, and the
		// default address has no control plane.
		hint = "; is a control plane listening there? Set --addr or RIALTO_ADDR (`rialto up` writes it to STATE/env)"
	}
	fmt.Fprintf(w, "rialto: error: %v%s\n", err, hint)
}

// apiHint says how the CLI takes a token, when the API refused
// the one it sent or there was none (a daemon's join: where it takes the
// bootstrap token), and that the API is HTTPS when it was called over
// plain HTTP.
func apiHint(ae *api.Error, path string) string {
	switch {
	case ae.Code == api.CodeUnauthorized && (path == "rialto agent" || path == "rialto appliance"):
		return "; the join sends the bootstrap token of --bootstrap-token-file or RIALTO_BOOTSTRAP_TOKEN, which must be the control plane's (rialto server --bootstrap-token-file): after its rotation, give this host the new one"
	case ae.Code == api.CodeUnauthorized:
		return "; the CLI sends the token in RIALTO_TOKEN or in the file of --token-file (`rialto up` writes it to STATE/env)"
	case strings.Contains(ae.Message, "HTTP request to an HTTPS server"):
		// Go's HTTPS server answering plain HTTP: --addr has http://.
		return "; the control plane serves HTTPS: write --addr (RIALTO_ADDR) with https://"
	}
	return ""
}

// devicesHint is where to look when no device has room for a request.
const devicesHint = "`rialto devices` lists each device's capacity and allocation"

// infeasibleHint says where to look after the control plane's explanation
// of a request no device can hold (which gives the first devices' reasons
// only): the devices, and for lease create, explain with the same flags.
func infeasibleHint(ae *api.Error, path string) string {
	if ae.Code != api.CodeInfeasible {
		return ""
	}
	if path == "rialto lease create" {
		return "; " + devicesHint + ", `rialto explain` with the same flags each device's reason"
	}
	return "; " + devicesHint
}

// notFoundHint says where to find the IDs a not_found answer is about
// (a mistyped or someone else's lease, node or device).
func notFoundHint(ae *api.Error) string {
	if ae.Code != api.CodeNotFound {
		return ""
	}
	for _, h := range []struct{ prefix, verb string }{
		{"lease ", "`rialto leases` lists your live leases (--all: ended ones too)"},
		{"node ", "`rialto nodes` lists the nodes"},
		{"device ", "`rialto devices` lists the devices"},
	} {
		if strings.HasPrefix(ae.Message, h.prefix) {
			return "; " + h.verb
		}
	}
	return ""
}

// newRoot builds the command tree for one run, its output going to e.
func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "rialto",
		Short: "Rialto turns Linux servers into a pool of lendable devices.",
		Long: "Rialto turns Linux servers into a pool of lendable devices.\n\n" +
			"Client verbs talk to --addr (or RIALTO_ADDR) with --token (or RIALTO_TOKEN), verifying its\n" +
			"HTTPS certificate against --cacert (or RIALTO_CACERT); verbs that print objects take\n" +
			"-o json|yaml|template=TEMPLATE. A flag value (or INPUT) written @FILE is read from FILE,\n" +
			"as in curl; write @@TEXT for literal text that starts with @.",
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return usagef("unknown command %q", args[0])
		},
	}
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.AddGroup(&cobra.Group{ID: groupDaemon, Title: "Daemons:"},
		&cobra.Group{ID: groupClient, Title: "Client verbs (talk to a control plane):"},
		&cobra.Group{ID: groupTool, Title: "Tools:"})
	root.SetHelpCommandGroupID(groupTool)
	root.SetCompletionCommandGroupID(groupTool)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.CompletionOptions.HiddenDefaultCmd = false

	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	groups := map[string]*cobra.Command{}
	for _, n := range names {
		c := commands[n]
		words := strings.Fields(n)
		parent := root
		if len(words) == 2 {
			parent = groups[words[0]]
			if parent == nil {
				parent = groupCommand(words[0])
				parent.GroupID = groupOf(words[0])
				groups[words[0]] = parent
				root.AddCommand(parent)
			}
		}
		cc := verbCommand(e, c, words[len(words)-1])
		if len(words) == 1 {
			cc.GroupID = groupOf(words[0])
		}
		parent.AddCommand(cc)
	}
	return root
}

// groupCommand is the first word of two-word verbs: by itself it is a
// usage mistake.
func groupCommand(word string) *cobra.Command {
	return &cobra.Command{
		Use:   word + " VERB",
		Short: groupSummaries[word],
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q", word+" "+args[0])
			}
			var verbs []string
			for _, s := range cmd.Commands() {
				verbs = append(verbs, s.Name())
			}
			return usagef("%s needs a verb (%s)", cmd.CommandPath(), strings.Join(verbs, ", "))
		},
	}
}

// verbCommand makes c a cobra command named word.
func verbCommand(e *env, c *command, word string) *cobra.Command {
	use := word
	if c.Args != "" {
		use += " " + c.Args
	}
	cc := &cobra.Command{
		Use:     use,
		Short:   c.Summary,
		Aliases: c.Aliases,
		Args:    posArgs(c),
	}
	if c.Help != "" {
		cc.Long = c.Summary + "\n\n" + c.Help
	}
	fs := cc.Flags()
	fs.SortFlags = false
	run := c.Flags(e, fs)
	// Flags with a fixed set of values (--kind, --mode, -o) complete them.
	fs.VisitAll(func(f *pflag.Flag) {
		if v, ok := f.Value.(interface{ completions() []string }); ok {
			words := v.completions()
			cc.RegisterFlagCompletionFunc(f.Name, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
				return words, cobra.ShellCompDirectiveNoFileComp
			})
		}
	})
	cc.RunE = func(cmd *cobra.Command, args []string) error {
		if c.Deprecated != "" && cmd.CalledAs() != word {
			fmt.Fprintf(e.stderr, "rialto: %q is deprecated: %s\n", cmd.CalledAs(), c.Deprecated)
		}
		return run(cmd.Context(), args)
	}
	return cc
}

// posArgs checks the number of positional arguments.
func posArgs(c *command) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) < c.MinArgs || (c.MaxArgs >= 0 && len(args) > c.MaxArgs) {
			if c.Args == "" {
				return usagef("wrong number of arguments: %s takes none", c.Name)
			}
			return usagef("wrong number of arguments: want %s", c.Args)
		}
		// An empty argument names nothing (a lease, a node, a file):
		// sent on, it would reach the API as a path with no ID
		// ("no route GET /v1/leases/").
		if slices.Contains(args, "") {
			return usagef("an empty argument: want %s", c.Args)
		}
		return nil
	}
}
