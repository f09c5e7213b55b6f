package mct

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"
)

func TestMatchesBruteForce(t *testing.T) {
	for _, tc := range []struct {
		name           string
		rules, queries int
		seed           uint64
	}{
		{"tiny", 5, 2000, 1},
		{"small", 200, 3000, 2},
		{"large", 2000, 1200, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 99))
			rs := Generate(r, tc.rules)
			// Round-trip the rule set through JSON like a role config.
			b, err := json.Marshal(rs)
			if err != nil {
				t.Fatal(err)
			}
			var back RuleSet
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			e, err := Compile(back)
			if err != nil {
				t.Fatal(err)
			}
			merged, trie := e.States()
			if merged > trie {
				t.Fatalf("merging grew the automaton: %d > %d", merged, trie)
			}
			t.Logf("%d rules: %d trie states, %d after suffix merging", tc.rules, trie, merged)
			qs, err := e.EncodeAll(GenerateQueries(r, tc.queries))
			if err != nil {
				t.Fatal(err)
			}
			matched := 0
			for i := 0; i < tc.queries; i++ {
				q := qs[i*QuerySize : (i+1)*QuerySize]
				gr, gw, gok := e.Match(q)
				wr, ww, wok := e.BruteForce(q)
				if gr != wr || gw != ww || gok != wok {
					t.Fatalf("query %d: nfa (%d,%d,%v) brute force (%d,%d,%v)", i, gr, gw, gok, wr, ww, wok)
				}
				if gok {
					matched++
				}
			}
			if tc.rules >= 200 && matched == 0 {
				t.Fatal("no query matched: generator is degenerate")
			}
			out := make([]byte, tc.queries*ResultSize)
			if err := e.MatchBatch(qs, out); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < tc.queries; i++ {
				want, _, _ := e.BruteForce(qs[i*QuerySize:])
				if got := binary.LittleEndian.Uint32(out[4*i:]); got != want {
					t.Fatalf("batch query %d: %d want %d", i, got, want)
				}
			}
		})
	}
}

func TestHandWritten(t *testing.T) {
	rs := RuleSet{
		Fields: []Field{{"station", Categorical}, {"flight", Numeric}},
		Rules: []Rule{
			{When: map[string]Criterion{}, Weight: 1, Result: 90},
			{When: map[string]Criterion{"station": {Kind: Exact, Value: "NCE"}}, Weight: 10, Result: 45},
			{When: map[string]Criterion{"station": {Kind: Exact, Value: "NCE"}, "flight": {Kind: Range, Lo: 100, Hi: 199}}, Weight: 20, Result: 30},
			{When: map[string]Criterion{"flight": {Kind: Exact, Lo: 150, Hi: 150}}, Weight: 20, Result: 35},
		},
	}
	e, err := Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		station, flight string
		want            uint32
	}{
		{"MAD", "5", 90},
		{"NCE", "5", 45},
		{"NCE", "100", 30},
		{"NCE", "150", 35}, // tie on weight 20: the larger result wins
		{"MAD", "150", 35},
		{"NCE", "200", 45},
	} {
		q, err := e.Encode([]string{tc.station, tc.flight})
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := e.Match(q[:]); got != tc.want {
			t.Errorf("%s/%s: %d want %d", tc.station, tc.flight, got, tc.want)
		}
	}
}

func TestCompileRejects(t *testing.T) {
	f := []Field{{"a", Categorical}, {"n", Numeric}}
	for _, tc := range []struct {
		name string
		rs   RuleSet
		want error
	}{
		{"no fields", RuleSet{}, ErrSchema},
		{"bad kind", RuleSet{Fields: []Field{{"a", "x"}}}, ErrSchema},
		{"dup field", RuleSet{Fields: []Field{{"a", Numeric}, {"a", Numeric}}}, ErrSchema},
		{"unknown field", RuleSet{Fields: f, Rules: []Rule{{When: map[string]Criterion{"z": {Kind: Exact, Value: "x"}}}}}, ErrRule},
		{"range on categorical", RuleSet{Fields: f, Rules: []Rule{{When: map[string]Criterion{"a": {Kind: Range, Lo: 1, Hi: 2}}}}}, ErrRule},
		{"inverted range", RuleSet{Fields: f, Rules: []Rule{{When: map[string]Criterion{"n": {Kind: Range, Lo: 3, Hi: 2}}}}}, ErrRule},
	} {
		if _, err := Compile(tc.rs); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 7))
	e, err := Compile(Generate(r, 5000))
	if err != nil {
		b.Fatal(err)
	}
	qs, _ := e.EncodeAll(GenerateQueries(r, 4096))
	out := make([]byte, 4096*ResultSize)
	b.SetBytes(int64(len(qs)))
	for b.Loop() {
		_ = e.MatchBatch(qs, out)
	}
}
