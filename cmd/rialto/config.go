package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/rialto-project/rialto/internal/config"
	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/spf13/pflag"
)

// daemonConfig is a daemon's --config FILE (env RIALTO_CONFIG): a TOML
// file with a key per flag (internal/config, docs/operations.md). The
// command line overrides it; the file overrides the environment.
type daemonConfig struct {
	fs   *pflag.FlagSet
	e    *env
	path *string
	// cmdline are the flags given on the command line, with their values
	// then (for reloading: the file never overrides them).
	cmdline map[string][]string
}

// configFlag registers --config on fs. Call apply once the command line
// is parsed.
func configFlag(fs *pflag.FlagSet, e *env) *daemonConfig {
	c := &daemonConfig{fs: fs, e: e}
	c.path = fs.String("config", e.getenv("RIALTO_CONFIG"), "TOML configuration `file`: KEY = VALUE with KEY a flag's name (flags on the command line override it; env RIALTO_CONFIG; docs/operations.md)")
	return c
}

// load reads the file and checks its keys: flags of fs, but --config.
func (c *daemonConfig) load() (*config.File, error) {
	file, err := config.Load(*c.path)
	if err != nil {
		return nil, err
	}
	if e, ok := file.Lookup("config"); ok {
		return nil, &config.Error{Path: file.Path, Line: e.Line, Key: e.Key, Err: errConfigKey}
	}
	for _, e := range file.Entries {
		if f := c.fs.Lookup(e.Key); f != nil {
			if _, secret := f.Value.(refusedFlag); secret {
				return nil, &config.Error{Path: file.Path, Line: e.Line, Key: e.Key,
					Err: fmt.Errorf("a secret is not written in the configuration file (readable by more than the daemon, copied around): give %s-file, a file holding it", e.Key)}
			}
		}
	}
	if err := file.Check(c.known); err != nil {
		return nil, err
	}
	return file, nil
}

func (c *daemonConfig) known(name string) bool { return c.fs.Lookup(name) != nil }

// apply sets every flag the file names that the command line did not.
func (c *daemonConfig) apply() error {
	c.cmdline = map[string][]string{}
	c.fs.Visit(func(f *pflag.Flag) { c.cmdline[f.Name] = flagValues(f.Value) })
	if *c.path == "" {
		return nil
	}
	file, err := c.load()
	if err == nil {
		err = file.Apply(c.fs, c.known, func(name string) bool { _, ok := c.cmdline[name]; return ok })
	}
	if ce := (*config.Error)(nil); errors.As(err, &ce) {
		// A key no flag has, a value that does not parse, a secret
		// written in the file: a mistake in the daemon's settings, as
		// on its command line (exit 2). A file that cannot be read is
		// a failure (exit 1).
		return usageError{err}
	}
	return err
}

// flagValues returns a flag's value as the texts that would set it again.
func flagValues(v pflag.Value) []string {
	switch v := v.(type) {
	case *listFlag:
		return append([]string(nil), *v...)
	}
	return []string{v.String()}
}

// serverReloadable are the flags of rialto server that SIGHUP reloads.
// The token files are read again; a secret without its file comes from
// the environment, which a running process cannot be given anew.
var serverReloadable = []string{"quota", "token-file", "admin-token-file", "bootstrap-token-file"}

// serverSettings reads the file again and returns the settings the server
// would start with now: each reloadable flag from the command line if it
// was given there, else from the file, else its default; the token files
// they name read again. A key no flag has is an error, as at start; keys
// that are not reloadable are checked but take effect only at a restart.
func (c *daemonConfig) serverSettings() (controlplane.Settings, error) {
	var file *config.File
	if *c.path != "" {
		f, err := c.load()
		if err != nil {
			return controlplane.Settings{}, err
		}
		file = f
	}
	vals := map[string][]string{}
	for _, name := range serverReloadable {
		if given, ok := c.cmdline[name]; ok {
			vals[name] = given
		} else if file != nil {
			if e, ok := file.Lookup(name); ok {
				vals[name] = e.Values
			}
		}
	}
	// A value the file gave that does not parse is named by its line.
	at := func(key string, err error) error {
		if _, given := c.cmdline[key]; given || file == nil {
			return fmt.Errorf("--%s: %w", key, err)
		}
		if e, ok := file.Lookup(key); ok {
			return &config.Error{Path: file.Path, Line: e.Line, Key: key, Err: err}
		}
		return err
	}
	secretOf := func(name, env string) (string, error) {
		s := &secret{name: name, env: env, envValue: c.e.getenv(env), file: last(vals[name+"-file"])}
		return s.get()
	}
	tokensS := &secret{name: "token", env: "RIALTO_TOKENS", envValue: c.e.getenv("RIALTO_TOKENS"), file: last(vals["token-file"])}
	boot, err := secretOf("bootstrap-token", "RIALTO_BOOTSTRAP_TOKEN")
	if err != nil {
		return controlplane.Settings{}, err
	}
	admin, err := secretOf("admin-token", "RIALTO_ADMIN_TOKEN")
	if err != nil {
		return controlplane.Settings{}, err
	}
	specs, err := tokensS.get()
	if err != nil {
		return controlplane.Settings{}, err
	}
	tokens, err := parseTokens(tokensFrom(tokensS), specs)
	if err != nil {
		// The line's number, not its text: it is a secret.
		return controlplane.Settings{}, fmt.Errorf("tenant tokens: %w", err)
	}
	if admin != "" {
		tokens = append(tokens, controlplane.Token{Token: admin, Tenant: "admin", Admin: true})
	}
	quotas, err := parseQuotas(vals["quota"])
	if err != nil {
		return controlplane.Settings{}, at("quota", err)
	}
	return controlplane.Settings{BootstrapToken: boot, Tokens: tokens, Quotas: quotas}, nil
}

func last(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// reloadOnHUP reloads the server's tokens and quotas (serverSettings) on
// every SIGHUP until ctx is done or the returned stop is called (which
// waits for it). Settings it cannot read or that the control plane
// refuses are logged and change nothing.
func (c *daemonConfig) reloadOnHUP(ctx context.Context, log *slog.Logger, srv *controlplane.Server) (stop func()) {
	return onHUP(ctx, func() {
		log.Info("SIGHUP: reloading tokens and quotas", "config", *c.path)
		set, err := c.serverSettings()
		if err == nil {
			err = srv.Reload(ctx, set)
		}
		if err != nil {
			log.Error("reload refused: the previous tokens and quotas stay", "config", *c.path, "err", err)
		}
	})
}

// onHUP runs reload, in a goroutine of its own, on every SIGHUP the
// process gets until ctx is done or the returned stop is called (which
// waits for the goroutine to end).
func onHUP(ctx context.Context, reload func()) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload()
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		cancel()
		<-done
	}
}

// errConfigKey is what a file that names --config gets.
var errConfigKey = errors.New("a configuration file cannot name another")
