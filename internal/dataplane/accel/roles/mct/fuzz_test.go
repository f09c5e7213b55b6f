package mct

import (
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// FuzzRuleSet feeds arbitrary rule-set JSON (a role's config comes from the
// management API) to Compile; whatever compiles must agree with the
// brute-force scan on random queries.
func FuzzRuleSet(f *testing.F) {
	f.Add([]byte(`{"fields":[{"name":"a","kind":"categorical"},{"name":"n","kind":"numeric"}],
		"rules":[{"when":{"a":"X","n":[1,5]},"weight":3,"result":7},{"when":{"n":2},"weight":3,"result":9},{"when":{},"weight":0,"result":1}]}`))
	f.Add([]byte(`{"fields":[{"name":"n","kind":"numeric"}],"rules":[{"when":{"n":"*"},"weight":4294967295,"result":4294967295}]}`))
	b, _ := json.Marshal(Generate(rand.New(rand.NewPCG(1, 1)), 20))
	f.Add(b)
	f.Fuzz(func(t *testing.T, cfg []byte) {
		var rs RuleSet
		if json.Unmarshal(cfg, &rs) != nil || len(rs.Rules) > 200 {
			return
		}
		e, err := Compile(rs)
		if err != nil {
			return
		}
		r := rand.New(rand.NewPCG(uint64(len(cfg)), 3))
		q := make([]byte, QuerySize)
		for i := 0; i < 50; i++ {
			for j := 0; j < NumFields; j++ {
				// Small codes hit the dictionaries and the ranges.
				binary.LittleEndian.PutUint32(q[4*j:], r.Uint32N(8))
			}
			gr, gw, gok := e.Match(q)
			wr, ww, wok := e.BruteForce(q)
			if gr != wr || gw != ww || gok != wok {
				t.Fatalf("query %x: nfa (%d,%d,%v) brute force (%d,%d,%v)", q, gr, gw, gok, wr, ww, wok)
			}
		}
	})
}
