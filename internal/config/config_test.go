package config_test

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/internal/config"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

// flags is a flag set like a daemon's: every kind of value.
type flags struct {
	fs        *flag.FlagSet
	listen    *string
	port      *int
	ratio     *float64
	insecure  *bool
	heartbeat *time.Duration
	quotas    list
}

func newFlags() *flags {
	f := &flags{fs: flag.NewFlagSet("t", flag.ContinueOnError)}
	f.listen = f.fs.String("listen", "127.0.0.1:7070", "")
	f.port = f.fs.Int("port", 0, "")
	f.ratio = f.fs.Float64("ratio", 0.5, "")
	f.insecure = f.fs.Bool("insecure-http", false, "")
	f.heartbeat = f.fs.Duration("heartbeat", time.Second, "")
	f.fs.Var(&f.quotas, "quota", "")
	return f
}

func (f *flags) String() string {
	return fmt.Sprintf("listen=%s port=%d ratio=%g insecure-http=%t heartbeat=%v quota=%q",
		*f.listen, *f.port, *f.ratio, *f.insecure, *f.heartbeat, []string(f.quotas))
}

// apply parses args as a command line, then the file, as the daemons do.
func apply(t *testing.T, text string, args ...string) (*flags, error) {
	t.Helper()
	f := newFlags()
	if err := f.fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	given := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	path := filepath.Join(t.TempDir(), "rialto.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	file, err := config.Load(path)
	if err != nil {
		return f, err
	}
	known := func(n string) bool { return f.fs.Lookup(n) != nil }
	return f, file.Apply(f.fs, known, func(n string) bool { return given[n] })
}

func TestApply(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		args []string
		want string // the flags after, or the error (path replaced by FILE)
	}{
		{name: "empty", file: "",
			want: `listen=127.0.0.1:7070 port=0 ratio=0.5 insecure-http=false heartbeat=1s quota=[]`},
		{name: "every kind", file: "# a comment\nlisten = \"0.0.0.0:7070\"\nport = 7071\nratio = 0.25\ninsecure-http = true\nheartbeat = \"250ms\"\nquota = [\"leases=5\", \"alice:slots=2\"]\n",
			want: `listen=0.0.0.0:7070 port=7071 ratio=0.25 insecure-http=true heartbeat=250ms quota=["leases=5" "alice:slots=2"]`},
		{name: "integer forms", file: "port = 0x1b9e\nratio = 1_000\n",
			want: `listen=127.0.0.1:7070 port=7070 ratio=1000 insecure-http=false heartbeat=1s quota=[]`},
		{name: "scalar for a repeatable flag", file: "quota = \"leases=1\"\n",
			want: `listen=127.0.0.1:7070 port=0 ratio=0.5 insecure-http=false heartbeat=1s quota=["leases=1"]`},
		{name: "command line wins", file: "listen = \"0.0.0.0:1\"\nport = 2\nquota = [\"leases=5\"]\n", args: []string{"--listen", "127.0.0.1:9", "--quota", "leases=1"},
			want: `listen=127.0.0.1:9 port=2 ratio=0.5 insecure-http=false heartbeat=1s quota=["leases=1"]`},
		{name: "unknown key", file: "listen = \"x\"\n\nlisten-addr = \"y\"\n",
			want: `FILE:3: unknown key "listen-addr": no flag --listen-addr`},
		{name: "unknown key sets nothing", file: "port = 5\nbogus = 1\n",
			want: `FILE:2: unknown key "bogus": no flag --bogus`},
		{name: "duration as the flag parses it", file: "heartbeat = 1\n",
			want: `FILE:1: heartbeat: invalid value "1": parse error`},
		{name: "boolean as a string the flag refuses", file: "insecure-http = \"yes\"\n",
			want: `FILE:1: insecure-http: invalid value "yes": parse error`},
		{name: "integer the flag refuses", file: "port = 1.5\n",
			want: `FILE:1: port: invalid value "1.5": parse error`},
		{name: "table", file: "port = 1\n[server]\nlisten = \"x\"\n",
			want: `FILE:2: server: tables are not allowed: the file is flat, KEY = VALUE with KEY a flag's name`},
		{name: "dotted key", file: "server.listen = \"x\"\n",
			want: `FILE:1: server: tables are not allowed: the file is flat, KEY = VALUE with KEY a flag's name`},
		{name: "inline table", file: "quota = {leases = 1}\n",
			want: `FILE:1: quota: tables are not allowed: the file is flat, KEY = VALUE with KEY a flag's name`},
		{name: "date-time", file: "listen = 2026-01-01\n",
			want: `FILE:1: listen: a date-time: give the flag's text as a string`},
		{name: "nested array", file: "quota = [[\"a\"]]\n",
			want: `FILE:1: quota: nested arrays are not allowed: an array lists a repeatable flag's values`},
		{name: "syntax error", file: "port = 1\nlisten = \n",
			want: `FILE:2: toml: unexpected character U+000A at start of value`},
		{name: "key twice", file: "port = 1\nport = 2\n",
			want: `FILE:2: toml: key port is already defined`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := apply(t, tc.file, tc.args...)
			got := ""
			if err != nil {
				var ce *config.Error
				if !errors.As(err, &ce) {
					t.Fatalf("error %v is not a *config.Error", err)
				}
				got = strings.Replace(err.Error(), ce.Path, "FILE", 1)
			} else {
				got = f.String()
			}
			if got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := config.Load(filepath.Join(t.TempDir(), "absent.toml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want a not-exist error", err)
	}
}

// FuzzParse: no input makes Parse panic, and what it accepts applies to a
// flag set or fails with a *config.Error.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "port = 1\n", "quota = [\"a\", \"b\"]\n", "[t]\nx=1", "a.b = 1", "x = {y = 1}", "listen = 2026-01-01T00:00:00Z", "port = 0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		file, err := config.Parse("f.toml", []byte(s))
		if err != nil {
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *config.Error", err)
			}
			return
		}
		fl := newFlags()
		err = file.Apply(fl.fs, func(string) bool { return true }, nil)
		var ce *config.Error
		if err != nil && !errors.As(err, &ce) {
			t.Fatalf("error %v is not a *config.Error", err)
		}
	})
}
