// Command rialto is Rialto's one binary: the control plane (server), the
// node agent (agent), a whole local cluster (up) and the CLI verbs that
// talk to a control plane. Run `rialto help` for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/memory/mapping"
	"github.com/rialto-project/rialto/internal/rack"
)

// command is one verb. A verb lives in its own file and registers itself
// from init with register.
type command struct {
	// Name is the verb as typed, possibly two words ("lease create").
	Name string
	// Args is the synopsis of positional arguments, e.g. "ID".
	Args    string
	Summary string
	// Run executes the verb with the arguments that follow its name.
	Run func(ctx context.Context, env *env, args []string) error
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.Name]; dup {
		panic("rialto: command registered twice: " + c.Name)
	}
	commands[c.Name] = c
}

// env is what a verb may touch of the process, so tests can run verbs in
// process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// errUsage marks an error in the command line (already explained).
var errUsage = errors.New("usage")

func main() {
	// A memory mapping's fault handler is this binary re-executed with the
	// hidden argument memory-fault-handler (docs/memory-protocol.md).
	mapping.RunFaultHandlerIfChild()
	// An emulated rack's reaper (`rialto up --netns`) is this binary with
	// the hidden argument rack-reaper (internal/rack).
	rack.RunReaperIfChild()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv})
	stop()
	os.Exit(code)
}

// run dispatches args to a verb and returns the exit code.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(e.stdout)
		return 0
	}
	c, rest := lookup(args)
	if c == nil && groupUsage(e.stderr, args[0]) {
		return 2
	}
	if c == nil {
		fmt.Fprintf(e.stderr, "rialto: unknown command %q\n\n", strings.Join(args[:min(2, len(args))], " "))
		usage(e.stderr)
		return 2
	}
	if err := c.Run(ctx, e, rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		printError(e.stderr, err)
		return 1
	}
	return 0
}

// lookup finds the longest registered verb that prefixes args.
func lookup(args []string) (*command, []string) {
	if len(args) >= 2 {
		if c := commands[args[0]+" "+args[1]]; c != nil {
			return c, args[2:]
		}
	}
	return commands[args[0]], args[1:]
}

// groupUsage lists the verbs of a group ("lease" → "lease create", …) and
// reports whether there were any.
func groupUsage(w io.Writer, group string) bool {
	var names []string
	for n := range commands {
		if strings.HasPrefix(n, group+" ") {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return false
	}
	sort.Strings(names)
	fmt.Fprintf(w, "Usage: rialto %s VERB ...\n\nVerbs:\n", group)
	tw := newTable(w)
	for _, n := range names {
		fmt.Fprintf(tw, "  %s %s\t%s\n", n, commands[n].Args, commands[n].Summary)
	}
	tw.Flush()
	return true
}

func printError(w io.Writer, err error) {
	var ae *api.Error
	if errors.As(err, &ae) {
		fmt.Fprintf(w, "rialto: error: %s (code %s, HTTP %d)\n", ae.Message, ae.Code, ae.Status)
		return
	}
	fmt.Fprintf(w, "rialto: error: %v\n", err)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Rialto turns Linux servers into a pool of lendable devices.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: rialto COMMAND [flags] [args]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := newTable(w)
	for _, n := range names {
		c := commands[n]
		fmt.Fprintf(tw, "  %s %s\t%s\n", n, c.Args, c.Summary)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "CLI verbs talk to --addr (or RIALTO_ADDR) with --token (or RIALTO_TOKEN), verifying its")
	fmt.Fprintln(w, "HTTPS certificate against --cacert (or RIALTO_CACERT); every verb takes -o json.")
	fmt.Fprintln(w, "Run `rialto COMMAND -h` for its flags.")
}

// newFlags returns a flag set for a verb that prints its usage to env's
// stderr.
func newFlags(e *env, c string, args string) *flag.FlagSet {
	fs := flag.NewFlagSet(c, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: rialto %s [flags] %s\n", c, args)
		if cmd := commands[c]; cmd != nil {
			fmt.Fprintf(e.stderr, "\n%s\n", cmd.Summary)
		}
		fmt.Fprintln(e.stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	return fs
}

// secret is a secret a verb is given through --NAME-file (a file holding
// it) or an environment variable, never on the command line: a command
// line is visible to every user of the machine (ps, /proc/PID/cmdline).
// --NAME itself is still accepted by the parser, so that its value never
// reaches a usage error, and refused by get with a message that says what
// to use instead.
type secret struct {
	name, env string
	file      string
	envValue  string
	refused   bool
}

// refusedFlag records that a secret was given on the command line and
// forgets its value.
type refusedFlag struct{ used *bool }

func (f refusedFlag) String() string     { return "" }
func (f refusedFlag) Set(v string) error { *f.used = true; return nil }

// secretFile registers --NAME-file and the refused --NAME for a secret
// whose environment variable is env; what says what it is.
func secretFile(fs *flag.FlagSet, e *env, name, env, what string) *secret {
	s := &secret{name: name, env: env, envValue: e.getenv(env)}
	fs.StringVar(&s.file, name+"-file", "", fmt.Sprintf("`file` holding %s (env %s; never on the command line)", what, env))
	fs.Var(refusedFlag{&s.refused}, name, fmt.Sprintf("refused: a command line is visible to every user; use --%s-file or %s", name, env))
	return s
}

// get returns the secret: --NAME-file's content (trimmed), else the
// environment's value ("" if neither).
func (s *secret) get() (string, error) {
	if s.refused {
		return "", fmt.Errorf("--%s puts a secret on the command line, where every user of the machine sees it (ps, /proc/PID/cmdline): use --%s-file FILE or the environment variable %s", s.name, s.name, s.env)
	}
	if s.file == "" {
		return strings.TrimSpace(s.envValue), nil
	}
	b, err := os.ReadFile(s.file)
	if err != nil {
		return "", fmt.Errorf("--%s-file: %w", s.name, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("--%s-file: %s is empty", s.name, s.file)
	}
	return v, nil
}

// parse parses flags that may appear before, between or after positional
// arguments, and checks the number of positionals.
func parse(fs *flag.FlagSet, args []string, minPos, maxPos int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) < minPos || (maxPos >= 0 && len(pos) > maxPos) {
		fmt.Fprintf(fs.Output(), "rialto %s: wrong number of arguments\n", fs.Name())
		fs.Usage()
		return nil, errUsage
	}
	return pos, nil
}
