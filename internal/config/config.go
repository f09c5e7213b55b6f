package config

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Flags is a flag set the file's keys are applied to: Set parses value as
// the flag called name would from the command line.
type Flags interface {
	Set(name, value string) error
}

// Entry is one key of a file with its values as text (one for a scalar,
// one per element for an array) and the line it is on.
type Entry struct {
	Key    string
	Values []string
	Line   int
}

// File is a parsed configuration file: its entries in the order of the
// file.
type File struct {
	Path    string
	Entries []Entry
}

// Error is a problem with one line of a file.
type Error struct {
	Path string
	Line int    // 0: the file as a whole
	Key  string // "" for a syntax error
	Err  error
}

func (e *Error) Error() string {
	loc := e.Path
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.Path, e.Line)
	}
	if e.Key == "" {
		return fmt.Sprintf("%s: %v", loc, e.Err)
	}
	if errors.Is(e.Err, ErrUnknownKey) {
		return fmt.Sprintf("%s: unknown key %q: no flag --%s", loc, e.Key, e.Key)
	}
	return fmt.Sprintf("%s: %s: %v", loc, e.Key, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrUnknownKey is the error of a key that names no flag.
var ErrUnknownKey = errors.New("config: unknown key")

// Load reads and parses the file at path.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, b)
}

// Parse parses data, the content of the file path (named in errors).
func Parse(path string, data []byte) (*File, error) {
	var values map[string]any
	if err := toml.Unmarshal(data, &values); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, _ := de.Position()
			return nil, &Error{Path: path, Line: line, Err: errors.New(de.Error())}
		}
		return nil, &Error{Path: path, Err: err}
	}
	f := &File{Path: path}
	// The decoder gives the values; the parser gives each key's line and
	// the order of the file.
	p := unstable.Parser{}
	p.Reset(data)
	lines := map[string]int{}
	for p.NextExpression() {
		e := p.Expression()
		var it unstable.Iterator
		switch e.Kind {
		case unstable.KeyValue, unstable.Table, unstable.ArrayTable:
			it = e.Key()
		default:
			continue
		}
		if !it.Next() {
			continue
		}
		first := it.Node()
		line := p.Shape(first.Raw).Start.Line
		key := string(first.Data)
		if e.Kind != unstable.KeyValue || !it.IsLast() {
			return nil, &Error{Path: path, Line: line, Key: key, Err: errors.New("tables are not allowed: the file is flat, KEY = VALUE with KEY a flag's name")}
		}
		if prev, dup := lines[key]; dup {
			return nil, &Error{Path: path, Line: line, Key: key, Err: fmt.Errorf("given twice (line %d too)", prev)}
		}
		lines[key] = line
		vs, err := text(values[key])
		if err != nil {
			return nil, &Error{Path: path, Line: line, Key: key, Err: err}
		}
		f.Entries = append(f.Entries, Entry{Key: key, Values: vs, Line: line})
	}
	if err := p.Error(); err != nil {
		return nil, &Error{Path: path, Err: err}
	}
	return f, nil
}

// text renders a decoded TOML value as the flag text it stands for.
func text(v any) ([]string, error) {
	switch v := v.(type) {
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			if _, nested := e.([]any); nested {
				return nil, errors.New("nested arrays are not allowed: an array lists a repeatable flag's values")
			}
			s, err := text(e)
			if err != nil {
				return nil, err
			}
			out = append(out, s...)
		}
		return out, nil
	case string:
		return []string{v}, nil
	case bool:
		return []string{strconv.FormatBool(v)}, nil
	case int64:
		return []string{strconv.FormatInt(v, 10)}, nil
	case float64:
		return []string{strconv.FormatFloat(v, 'g', -1, 64)}, nil
	case map[string]any:
		return nil, errors.New("tables are not allowed: the file is flat, KEY = VALUE with KEY a flag's name")
	case time.Time, toml.LocalDate, toml.LocalDateTime, toml.LocalTime:
		return nil, errors.New("a date-time: give the flag's text as a string")
	}
	return nil, fmt.Errorf("a value of type %T is not allowed", v)
}

// Keys returns the file's keys in its order.
func (f *File) Keys() []string {
	out := make([]string, len(f.Entries))
	for i, e := range f.Entries {
		out[i] = e.Key
	}
	return out
}

// Lookup returns the entry of key.
func (f *File) Lookup(key string) (Entry, bool) {
	i := slices.IndexFunc(f.Entries, func(e Entry) bool { return e.Key == key })
	if i < 0 {
		return Entry{}, false
	}
	return f.Entries[i], true
}

// Check reports the first key that known does not accept (ErrUnknownKey).
func (f *File) Check(known func(name string) bool) error {
	for _, e := range f.Entries {
		if !known(e.Key) {
			return &Error{Path: f.Path, Line: e.Line, Key: e.Key, Err: ErrUnknownKey}
		}
	}
	return nil
}

// Apply checks every key against known, then sets each on fs, once per
// value, but for those changed reports (given on the command line, which
// wins). Nothing is set when a key is unknown; a value the flag refuses
// stops Apply with an error naming the key and its line.
func (f *File) Apply(fs Flags, known, changed func(name string) bool) error {
	if f == nil {
		return nil
	}
	if err := f.Check(known); err != nil {
		return err
	}
	for _, e := range f.Entries {
		if changed != nil && changed(e.Key) {
			continue
		}
		for _, v := range e.Values {
			if err := fs.Set(e.Key, v); err != nil {
				return &Error{Path: f.Path, Line: e.Line, Key: e.Key, Err: fmt.Errorf("invalid value %q: %w", v, err)}
			}
		}
	}
	return nil
}
