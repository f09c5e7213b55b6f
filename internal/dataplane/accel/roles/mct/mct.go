package mct

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// QuerySize is the size of one encoded query; NumFields the number of
// uint32 fields it holds.
const (
	QuerySize  = 64
	NumFields  = QuerySize / 4
	ResultSize = 4
	// NoMatch is the result of a query no rule matches.
	NoMatch uint32 = math.MaxUint32
)

// Errors.
var (
	ErrSchema = errors.New("mct: bad schema")
	ErrRule   = errors.New("mct: bad rule")
	ErrQuery  = errors.New("mct: bad query")
)

// Kind is the type of a field.
type Kind string

// Field kinds: categorical values are strings encoded through a per-field
// dictionary (exact match or wildcard); numeric values are uint32 (exact,
// range or wildcard).
const (
	Categorical Kind = "categorical"
	Numeric     Kind = "numeric"
)

// Field is one criterion of the schema.
type Field struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
}

// CritKind says how a criterion matches.
type CritKind uint8

// Criterion kinds.
const (
	Any CritKind = iota
	Exact
	Range
)

// Criterion is one condition of a rule on one field. Value is the
// categorical value; Lo and Hi bound a numeric value (Lo == Hi for exact).
type Criterion struct {
	Kind   CritKind
	Value  string
	Lo, Hi uint32
}

// MarshalJSON writes "*", a string, a number, or [lo, hi].
func (c Criterion) MarshalJSON() ([]byte, error) {
	switch {
	case c.Kind == Any:
		return []byte(`"*"`), nil
	case c.Value != "":
		return json.Marshal(c.Value)
	case c.Kind == Exact:
		return json.Marshal(c.Lo)
	default:
		return json.Marshal([2]uint32{c.Lo, c.Hi})
	}
}

// UnmarshalJSON reads the forms MarshalJSON writes.
func (c *Criterion) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		if s == "*" {
			*c = Criterion{Kind: Any}
		} else {
			*c = Criterion{Kind: Exact, Value: s}
		}
		return nil
	}
	var n uint32
	if json.Unmarshal(b, &n) == nil {
		*c = Criterion{Kind: Exact, Lo: n, Hi: n}
		return nil
	}
	var r [2]uint32
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%w: criterion %s: want \"*\", a string, a number or [lo,hi]", ErrRule, b)
	}
	*c = Criterion{Kind: Range, Lo: r[0], Hi: r[1]}
	return nil
}

// Rule matches a query when every criterion it names matches (fields it
// omits are wildcards).
type Rule struct {
	When   map[string]Criterion `json:"when"`
	Weight uint32               `json:"weight"`
	Result uint32               `json:"result"`
}

// RuleSet is a schema and its rules: the configuration of an "mct" role.
type RuleSet struct {
	Fields []Field `json:"fields"`
	Rules  []Rule  `json:"rules"`
}

// span is a criterion in encoded form: a closed interval of codes.
type span struct{ lo, hi uint32 }

var anySpan = span{0, math.MaxUint32}

// encRule is a rule with every field encoded as a span.
type encRule struct {
	s   [NumFields]span
	key uint64 // see leafKey
}

func leafKey(weight, result uint32) uint64 { return (uint64(weight)<<32 | uint64(result)) + 1 }

type edge struct {
	lo, hi uint32
	to     int32
}

type node struct {
	exact  []edge // lo == hi, sorted by lo
	ranges []edge
	any    int32  // child on the wildcard, or -1
	maxKey uint64 // best leaf key reachable from here
}

// Engine is a compiled rule set.
type Engine struct {
	fields []Field
	index  map[string]int
	dicts  []map[string]uint32 // per field; nil for numeric
	nodes  []node              // nodes[0] is the root; leaves have level NumFields
	root   int32
	rules  []encRule
	nTrie  int            // states before suffix merging
	order  [NumFields]int // automaton level → query field
}

// Compile validates rs, dictionary-encodes its values and builds the
// automaton.
func Compile(rs RuleSet) (*Engine, error) {
	if len(rs.Fields) == 0 || len(rs.Fields) > NumFields {
		return nil, fmt.Errorf("%w: %d fields, want 1..%d", ErrSchema, len(rs.Fields), NumFields)
	}
	e := &Engine{fields: rs.Fields, index: map[string]int{}, dicts: make([]map[string]uint32, len(rs.Fields))}
	for i, f := range rs.Fields {
		if f.Name == "" {
			return nil, fmt.Errorf("%w: field %d has no name", ErrSchema, i)
		}
		if _, dup := e.index[f.Name]; dup {
			return nil, fmt.Errorf("%w: field %q twice", ErrSchema, f.Name)
		}
		e.index[f.Name] = i
		switch f.Kind {
		case Categorical:
			e.dicts[i] = map[string]uint32{}
		case Numeric:
		default:
			return nil, fmt.Errorf("%w: field %q kind %q", ErrSchema, f.Name, f.Kind)
		}
	}
	e.rules = make([]encRule, len(rs.Rules))
	for ri, r := range rs.Rules {
		er := &e.rules[ri]
		for i := range er.s {
			er.s[i] = anySpan
		}
		er.key = leafKey(r.Weight, r.Result)
		for name, c := range r.When {
			fi, ok := e.index[name]
			if !ok {
				return nil, fmt.Errorf("%w %d: unknown field %q", ErrRule, ri, name)
			}
			if c.Kind == Any {
				continue
			}
			if e.dicts[fi] != nil {
				if c.Kind != Exact || c.Value == "" {
					return nil, fmt.Errorf("%w %d: categorical field %q takes a value or \"*\"", ErrRule, ri, name)
				}
				code, ok := e.dicts[fi][c.Value]
				if !ok {
					code = uint32(len(e.dicts[fi]) + 1) // 0 is "unknown value"
					e.dicts[fi][c.Value] = code
				}
				er.s[fi] = span{code, code}
				continue
			}
			if c.Value != "" || c.Lo > c.Hi {
				return nil, fmt.Errorf("%w %d: numeric field %q takes a number or [lo,hi] with lo<=hi", ErrRule, ri, name)
			}
			er.s[fi] = span{c.Lo, c.Hi}
		}
	}
	e.order = levelOrder(e.rules)
	e.build()
	return e, nil
}

// trie node used during construction.
type tnode struct {
	kids map[span]*tnode
	key  uint64
}

func (e *Engine) build() {
	root := &tnode{kids: map[span]*tnode{}}
	n := 1
	for _, r := range e.rules {
		t := root
		for lvl := 0; lvl < NumFields; lvl++ {
			sp := r.s[e.order[lvl]]
			k, ok := t.kids[sp]
			if !ok {
				k = &tnode{}
				if lvl < NumFields-1 {
					k.kids = map[span]*tnode{}
				}
				t.kids[sp] = k
				n++
			}
			t = k
		}
		if r.key > t.key {
			t.key = r.key
		}
	}
	e.nTrie = n
	// Merge equal suffixes bottom-up: two states are merged when they have
	// the same leaf key and the same labelled transitions to merged states.
	canon := map[string]int32{}
	var sig strings.Builder
	var walk func(t *tnode) int32
	walk = func(t *tnode) int32 {
		nd := node{any: -1, maxKey: t.key}
		labels := make([]span, 0, len(t.kids))
		for s := range t.kids {
			labels = append(labels, s)
		}
		sort.Slice(labels, func(i, j int) bool {
			if labels[i].lo != labels[j].lo {
				return labels[i].lo < labels[j].lo
			}
			return labels[i].hi < labels[j].hi
		})
		ids := make([]int32, len(labels))
		for i, s := range labels {
			ids[i] = walk(t.kids[s])
		}
		sig.Reset()
		fmt.Fprintf(&sig, "%d|", t.key)
		for i, s := range labels {
			fmt.Fprintf(&sig, "%d-%d>%d,", s.lo, s.hi, ids[i])
		}
		if id, ok := canon[sig.String()]; ok {
			return id
		}
		for i, s := range labels {
			ch := ids[i]
			if k := e.nodes[ch].maxKey; k > nd.maxKey {
				nd.maxKey = k
			}
			switch {
			case s == anySpan:
				nd.any = ch
			case s.lo == s.hi:
				nd.exact = append(nd.exact, edge{s.lo, s.hi, ch})
			default:
				nd.ranges = append(nd.ranges, edge{s.lo, s.hi, ch})
			}
		}
		// Visit the most promising range first.
		sort.SliceStable(nd.ranges, func(i, j int) bool {
			return e.nodes[nd.ranges[i].to].maxKey > e.nodes[nd.ranges[j].to].maxKey
		})
		id := int32(len(e.nodes))
		e.nodes = append(e.nodes, nd)
		canon[sig.String()] = id
		return id
	}
	e.root = walk(root)
}

// levelOrder puts the criteria that rules specify most often first: the
// automaton then branches on selective values near the root, where a
// mismatch prunes the most, and the rarely specified criteria (mostly
// wildcards) sit near the leaves, where suffix merging folds them.
func levelOrder(rules []encRule) [NumFields]int {
	var count [NumFields]int
	for _, r := range rules {
		for i, sp := range r.s {
			if sp != anySpan {
				count[i]++
			}
		}
	}
	var order [NumFields]int
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order[:], func(a, b int) bool { return count[order[a]] > count[order[b]] })
	return order
}

// States returns the number of automaton states after and before suffix
// merging.
func (e *Engine) States() (merged, trie int) { return len(e.nodes), e.nTrie }

// Fields returns the schema.
func (e *Engine) Fields() []Field { return append([]Field(nil), e.fields...) }

// Encode dictionary-encodes one query given as one string per field (in
// schema order; numeric fields in decimal). Categorical values no rule
// mentions encode to 0, which only wildcards match.
func (e *Engine) Encode(values []string) ([QuerySize]byte, error) {
	var q [QuerySize]byte
	if len(values) != len(e.fields) {
		return q, fmt.Errorf("%w: %d values for %d fields", ErrQuery, len(values), len(e.fields))
	}
	for i, v := range values {
		var code uint32
		if d := e.dicts[i]; d != nil {
			code = d[v]
		} else {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return q, fmt.Errorf("%w: field %q: %v", ErrQuery, e.fields[i].Name, err)
			}
			code = uint32(n)
		}
		binary.LittleEndian.PutUint32(q[4*i:], code)
	}
	return q, nil
}

// Match returns the result and weight of the best rule matching the encoded
// query q (QuerySize bytes), or ok == false.
func (e *Engine) Match(q []byte) (result, weight uint32, ok bool) {
	var f [NumFields]uint32
	for i := range f {
		f[i] = binary.LittleEndian.Uint32(q[4*e.order[i]:])
	}
	best := e.search(e.root, 0, &f, 0)
	if best == 0 {
		return NoMatch, 0, false
	}
	best--
	return uint32(best), uint32(best >> 32), true
}

func (e *Engine) search(id int32, lvl int, f *[NumFields]uint32, best uint64) uint64 {
	nd := &e.nodes[id]
	if nd.maxKey <= best {
		return best
	}
	if lvl == NumFields {
		return nd.maxKey
	}
	v := f[lvl]
	if len(nd.exact) > 0 {
		ex := nd.exact
		i := sort.Search(len(ex), func(i int) bool { return ex[i].lo >= v })
		if i < len(ex) && ex[i].lo == v {
			best = e.search(ex[i].to, lvl+1, f, best)
		}
	}
	for _, r := range nd.ranges {
		if v >= r.lo && v <= r.hi {
			best = e.search(r.to, lvl+1, f, best)
		}
	}
	if nd.any >= 0 {
		best = e.search(nd.any, lvl+1, f, best)
	}
	return best
}

// MatchBatch matches len(qs)/QuerySize queries and writes one little-endian
// uint32 result per query into out (NoMatch when none matches).
func (e *Engine) MatchBatch(qs, out []byte) error {
	if len(qs)%QuerySize != 0 {
		return fmt.Errorf("%w: batch of %d bytes is not a multiple of %d", ErrQuery, len(qs), QuerySize)
	}
	n := len(qs) / QuerySize
	if len(out) < n*ResultSize {
		return fmt.Errorf("%w: output of %d bytes for %d queries", ErrQuery, len(out), n)
	}
	for i := 0; i < n; i++ {
		r, _, _ := e.Match(qs[i*QuerySize : (i+1)*QuerySize])
		binary.LittleEndian.PutUint32(out[i*ResultSize:], r)
	}
	return nil
}

// BruteForce scans every rule for the encoded query q: the reference the
// automaton must agree with.
func (e *Engine) BruteForce(q []byte) (result, weight uint32, ok bool) {
	var best uint64
	for _, r := range e.rules {
		match := true
		for i := 0; i < NumFields; i++ {
			v := binary.LittleEndian.Uint32(q[4*i:])
			if v < r.s[i].lo || v > r.s[i].hi {
				match = false
				break
			}
		}
		if match && r.key > best {
			best = r.key
		}
	}
	if best == 0 {
		return NoMatch, 0, false
	}
	best--
	return uint32(best), uint32(best >> 32), true
}
