package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/template"
	"time"
	"unicode"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v4"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/netns"
	"github.com/rialto-project/rialto/internal/resource"
)

// This file holds the flag types the verbs share: they check their value
// when the command line is parsed, so a bad value is a usage mistake
// (exit 2) before anything runs.

// maxInline bounds what @FILE reads into a flag.
const maxInline = 1 << 20

// inline resolves a flag value that holds content, as curl does: "@FILE"
// is FILE's content ("@-": stdin), "@@TEXT" is the literal text "@TEXT",
// anything else is itself.
func inline(s string, stdin io.Reader) ([]byte, error) {
	switch {
	case strings.HasPrefix(s, "@@"):
		return []byte(s[1:]), nil
	case s == "@-":
		if stdin == nil {
			stdin = os.Stdin
		}
		return io.ReadAll(io.LimitReader(stdin, maxInline))
	case strings.HasPrefix(s, "@"):
		b, err := readLimited(s[1:], maxInline)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	return []byte(s), nil
}

// secret is a secret a verb is given through a file (--NAME-file FILE,
// or --NAME @FILE as in curl) or an environment variable, never on the
// command line: a command line is visible to every user of the machine
// (ps, /proc/PID/cmdline). A literal --NAME VALUE is still accepted by
// the parser, so that its value never reaches a usage error, and refused
// by get with a message that says what to use instead.
type secret struct {
	name, env string
	file      string
	envValue  string
	refused   bool
	// leadingLines: the lines get trimmed before the file's text (blank
	// ones), for a refusal to number the file's lines as an editor does.
	leadingLines int
}

// refusedFlag is --NAME of a secret: @FILE names the file holding it;
// anything else is a secret on the command line, recorded as refused and
// forgotten.
type refusedFlag struct {
	s *secret
	// setFile sets --NAME-file, so that @FILE is recorded as the file
	// flag given (a server's SIGHUP reads the files given again).
	setFile func(path string) error
}

func (f refusedFlag) String() string { return "" }
func (f refusedFlag) Type() string   { return "@FILE" }
func (f refusedFlag) Set(v string) error {
	if len(v) > 1 && v[0] == '@' && v[1] != '@' {
		return f.setFile(v[1:])
	}
	f.s.refused = true
	return nil
}

// secretFile registers --NAME-file and --NAME (@FILE only) for a secret
// whose environment variable is env; what says what it is.
func secretFile(fs *pflag.FlagSet, e *env, name, env, what string) *secret {
	s := &secret{name: name, env: env, envValue: e.getenv(env)}
	fs.StringVar(&s.file, name+"-file", "", fmt.Sprintf("`file` holding %s (env %s; never on the command line)", what, env))
	setFile := func(path string) error { return fs.Set(name+"-file", path) }
	fs.Var(refusedFlag{s, setFile}, name, fmt.Sprintf("@FILE: the same as --%s-file FILE (the secret itself on the command line is refused: every user sees it; use --%s-file or %s)", name, name, env))
	return s
}

// get returns the secret: the file's content (trimmed), else the
// environment's value ("" if neither).
func (s *secret) get() (string, error) {
	if s.refused {
		return "", usagef("--%s puts a secret on the command line, where every user of the machine sees it (ps, /proc/PID/cmdline): use --%s-file FILE or the environment variable %s (or --%s @FILE)", s.name, s.name, s.env, s.name)
	}
	if s.file == "" {
		return strings.TrimSpace(s.envValue), nil
	}
	b, err := readSecretFile(s.file)
	if err != nil {
		return "", fmt.Errorf("--%s-file: %w", s.name, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("--%s-file: %s is empty", s.name, s.file)
	}
	s.leadingLines = strings.Count(string(b[:len(b)-len(strings.TrimLeftFunc(string(b), unicode.IsSpace))]), "\n")
	return v, nil
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }
func (l *listFlag) Type() string       { return "value" }

// sizeFlag is a size in bytes written with a unit (256MiB, 10GiB, 1.5TB)
// or as bytes.
type sizeFlag struct {
	n    int64
	set  bool
	text string // as given
}

func (f *sizeFlag) String() string {
	if !f.set {
		return ""
	}
	return resource.FormatSize(f.n)
}
func (f *sizeFlag) Type() string { return "size" }
func (f *sizeFlag) Set(s string) error {
	n, err := resource.ParseSize(s)
	if err != nil {
		return fmt.Errorf("want a size such as 256MiB, 10GiB or 1TB")
	}
	f.n, f.set, f.text = n, true, s
	return nil
}

// sizeVar defines a size flag with a default written as text ("" for
// none).
func sizeVar(fs *pflag.FlagSet, name, def, usage string) *sizeFlag {
	f := &sizeFlag{}
	if def != "" {
		if err := f.Set(def); err != nil {
			panic(err)
		}
	}
	fs.Var(f, name, usage)
	return f
}

// rateFlag is a rate in bytes/s: "500MB/s", "64MiB/s", "500Mbit/s",
// "1Gbit/s", or bytes/s. kind, when set, is the request's --kind: the
// rate of a nic request shows as a link rate (resource.FormatLinkRate),
// as its lease's size prints, any other as rates print.
type rateFlag struct {
	v    float64
	set  bool
	kind *choiceFlag
}

func (f *rateFlag) String() string {
	if !f.set {
		return ""
	}
	if f.kind != nil {
		return kindRate(api.Kind(f.kind.v), f.v)
	}
	return resource.FormatRate(f.v)
}
func (f *rateFlag) Type() string { return "rate" }
func (f *rateFlag) Set(s string) error {
	v, err := parseRate(s)
	if err != nil {
		return err
	}
	f.v, f.set = v, true
	return nil
}

// durationFlag is a duration ("90s", "30m", "1h30m"); a bare number is
// seconds. Values below min are refused.
type durationFlag struct {
	d    time.Duration
	min  time.Duration
	set  bool
	text string // as given
}

func (f *durationFlag) String() string {
	if !f.set && f.d == 0 {
		return ""
	}
	return f.d.String()
}
func (f *durationFlag) Type() string { return "duration" }
func (f *durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		v, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return fmt.Errorf("want a duration such as 90s, 30m or 2h")
		}
		d = time.Duration(v * float64(time.Second))
	}
	if d < f.min {
		return fmt.Errorf("must be at least %v", f.min)
	}
	f.d, f.set, f.text = d, true, s
	return nil
}

// durationVar defines a durationFlag.
func durationVar(fs *pflag.FlagSet, name string, def, min time.Duration, usage string) *durationFlag {
	f := &durationFlag{d: def, min: min}
	fs.Var(f, name, usage)
	return f
}

// choiceFlag is one of a fixed list of words (case-insensitive).
type choiceFlag struct {
	v       string
	choices []string
	what    string // "kind"
}

func (f *choiceFlag) String() string { return f.v }
func (f *choiceFlag) Type() string   { return f.what }
func (f *choiceFlag) Set(s string) error {
	s = strings.ToLower(s)
	for _, c := range f.choices {
		if s == c {
			f.v = s
			return nil
		}
	}
	return fmt.Errorf("unknown %s (%s)", f.what, strings.Join(f.choices, ", "))
}

// completions are the values shell completion offers.
func (f *choiceFlag) completions() []string { return f.choices }

// kindFlag is a resource kind: the kinds the server accepts (api.Kinds).
func kindFlag(def api.Kind) *choiceFlag {
	f := &choiceFlag{v: string(def), what: "kind"}
	for _, k := range api.Kinds {
		f.choices = append(f.choices, string(k))
	}
	return f
}

// modeFlag is a lease mode (api.Modes).
func modeFlag() *choiceFlag {
	f := &choiceFlag{what: "mode"}
	for _, m := range api.Modes {
		f.choices = append(f.choices, string(m))
	}
	return f
}

// output is the -o flag of verbs that print objects: table (the
// default), json, yaml, or template=TEMPLATE (a Go text/template over the
// JSON fields; template=@FILE reads it from FILE).
type output struct {
	format string
	tmpl   *template.Template
}

func (o *output) String() string {
	if o.format == "" {
		return "table"
	}
	return o.format
}
func (o *output) Type() string { return "format" }
func (o *output) Set(s string) error {
	name, text, isTmpl := strings.Cut(s, "=")
	switch {
	case !isTmpl && (name == "table" || name == "json" || name == "yaml"):
		o.format, o.tmpl = name, nil
		return nil
	case isTmpl && (name == "template" || name == "go-template"):
		b, err := inline(text, nil)
		if err != nil {
			return err
		}
		t, err := template.New("o").Option("missingkey=zero").Parse(string(b))
		if err != nil {
			return err
		}
		o.format, o.tmpl = "template", t
		return nil
	}
	return fmt.Errorf("want table, json, yaml or template=TEMPLATE")
}
func (o *output) completions() []string { return []string{"table", "json", "yaml", "template="} }

// structured reports whether objects are printed as data, not tables.
func (o *output) structured() bool { return o.format != "" && o.format != "table" }

// outputVar defines -o/--output.
func outputVar(fs *pflag.FlagSet) *output {
	o := &output{}
	fs.VarP(o, "output", "o", "output format: table, json, yaml, or template=TEMPLATE (Go text/template over the JSON fields, run once per object; template=@FILE reads it)")
	return o
}

// print writes v in the chosen format (json for table: callers print
// tables themselves).
func (o *output) print(w io.Writer, v any) error {
	switch o.format {
	case "yaml":
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		// JSON is YAML: decoding into a node keeps the fields' order. The
		// node keeps JSON's flow style ({…}, […], "…") unless told
		// otherwise: block style is what a reader of YAML expects (strings
		// are still quoted where their tag needs it: "123", "true").
		var n yaml.Node
		if err := yaml.Unmarshal(b, &n); err != nil {
			return err
		}
		blockStyle(&n)
		out, err := yaml.Marshal(&n)
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	case "template":
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var g any
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		if err := d.Decode(&g); err != nil {
			return err
		}
		objs, ok := g.([]any)
		if !ok {
			objs = []any{g}
		}
		for _, x := range objs {
			var buf bytes.Buffer
			if err := o.tmpl.Execute(&buf, x); err != nil {
				return err
			}
			if !bytes.HasSuffix(buf.Bytes(), []byte("\n")) {
				buf.WriteByte('\n')
			}
			if _, err := w.Write(buf.Bytes()); err != nil {
				return err
			}
		}
		return nil
	}
	return printJSON(w, v)
}

// blockStyle clears the styles a node decoded from JSON carries, so it
// encodes as block YAML.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// sizeText is a string flag whose value must be a size (checked when
// parsed, so a bad one is a usage mistake); the verb parses it again.
type sizeText struct{ p *string }

func (f sizeText) String() string { return *f.p }
func (f sizeText) Type() string   { return "size" }
func (f sizeText) Set(s string) error {
	if _, err := resource.ParseSize(s); err != nil {
		return fmt.Errorf("want a size such as 256MiB, 10GiB or 1TB")
	}
	*f.p = s
	return nil
}

// sizeString defines a sizeText flag.
func sizeString(fs *pflag.FlagSet, name, def, usage string) *string {
	p := new(string)
	*p = def
	fs.Var(sizeText{p}, name, usage)
	return p
}

// tcRate is a link rate for tc: tc's syntax (1gbit, 400mbit, 100mbps) or
// the CLI's (500MB/s, 1Gbit/s); kept in tc's syntax (bits/s).
type tcRate struct{ p *string }

func (f tcRate) String() string { return *f.p }
func (f tcRate) Type() string   { return "rate" }
func (f tcRate) Set(s string) error {
	if _, err := netns.ParseRate(s); err == nil {
		*f.p = s
		return nil
	}
	v, err := parseRate(s)
	if err != nil || v < 1 {
		return fmt.Errorf("want a rate such as 1gbit, 400mbit, 500Mbit/s or 100MB/s")
	}
	*f.p = strconv.FormatInt(int64(v*8), 10) + "bit"
	return nil
}

// tcRateString defines a tcRate flag.
func tcRateString(fs *pflag.FlagSet, name, usage string) *string {
	p := new(string)
	fs.Var(tcRate{p}, name, usage)
	return p
}
