package mct

import (
	"fmt"
	"math/rand/v2"
	"strconv"
)

// MCTFields is a Minimum-Connecting-Time-like schema of 16 fields.
var MCTFields = []Field{
	{"arr_station", Categorical}, {"dep_station", Categorical},
	{"arr_carrier", Categorical}, {"dep_carrier", Categorical},
	{"arr_terminal", Categorical}, {"dep_terminal", Categorical},
	{"connection", Categorical}, {"arr_flight", Numeric},
	{"dep_flight", Numeric}, {"day", Numeric},
	{"arr_aircraft", Categorical}, {"dep_aircraft", Categorical},
	{"arr_codeshare", Categorical}, {"dep_codeshare", Categorical},
	{"prev_country", Categorical}, {"next_country", Categorical},
}

func pool(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

var (
	stations  = pool("S", 60)
	carriers  = pool("C", 40)
	terminals = pool("T", 4)
	conns     = []string{"DD", "DI", "ID", "II"}
	aircraft  = pool("A", 12)
	yesno     = []string{"Y", "N"}
	countries = pool("K", 30)
)

type opt struct {
	c  Criterion
	ok bool
}

// Generate returns a synthetic MCT rule set of n rules drawn from r: most
// rules are station-specific, carriers, terminals and connection types are
// often given, flight-number and date ranges sometimes, and more specific
// rules weigh more (the MCT precedence of specific over generic rules).
func Generate(r *rand.Rand, n int) RuleSet {
	rs := RuleSet{Fields: MCTFields}
	pick := func(p float64, vals []string) opt {
		if r.Float64() >= p {
			return opt{}
		}
		return opt{Criterion{Kind: Exact, Value: vals[r.IntN(len(vals))]}, true}
	}
	rng := func(p float64, max, width uint32) opt {
		if r.Float64() >= p {
			return opt{}
		}
		lo := r.Uint32N(max)
		if r.IntN(4) == 0 {
			return opt{Criterion{Kind: Exact, Lo: lo, Hi: lo}, true}
		}
		return opt{Criterion{Kind: Range, Lo: lo, Hi: lo + r.Uint32N(width)}, true}
	}
	for i := 0; i < n; i++ {
		w := map[string]Criterion{}
		spec := uint32(0)
		add := func(name string, o opt) {
			if o.ok {
				w[name] = o.c
				spec++
			}
		}
		st := pick(0.9, stations)
		add("arr_station", st)
		if st.ok && r.IntN(3) > 0 {
			add("dep_station", st)
		} else {
			add("dep_station", pick(0.2, stations))
		}
		add("arr_carrier", pick(0.6, carriers))
		add("dep_carrier", pick(0.5, carriers))
		add("arr_terminal", pick(0.3, terminals))
		add("dep_terminal", pick(0.3, terminals))
		add("connection", pick(0.7, conns))
		add("arr_flight", rng(0.15, 9000, 500))
		add("dep_flight", rng(0.15, 9000, 500))
		add("day", rng(0.25, 366, 120))
		add("arr_aircraft", pick(0.08, aircraft))
		add("dep_aircraft", pick(0.08, aircraft))
		add("arr_codeshare", pick(0.1, yesno))
		add("dep_codeshare", pick(0.1, yesno))
		add("prev_country", pick(0.15, countries))
		add("next_country", pick(0.15, countries))
		rs.Rules = append(rs.Rules, Rule{When: w, Weight: spec*10 + r.Uint32N(3), Result: 20 + 5*r.Uint32N(12)})
	}
	return rs
}

// GenerateQueries returns n queries (one string per MCTFields field) drawn
// from the same value pools as Generate, with a few values no rule knows.
func GenerateQueries(r *rand.Rand, n int) [][]string {
	one := func(vals []string) string {
		if r.IntN(50) == 0 {
			return "unknown"
		}
		return vals[r.IntN(len(vals))]
	}
	num := func(max uint32) string { return strconv.FormatUint(uint64(r.Uint32N(max)), 10) }
	out := make([][]string, n)
	for i := range out {
		st := one(stations)
		dep := st
		if r.IntN(5) == 0 {
			dep = one(stations)
		}
		out[i] = []string{st, dep, one(carriers), one(carriers), one(terminals), one(terminals),
			one(conns), num(9500), num(9500), num(366), one(aircraft), one(aircraft),
			one(yesno), one(yesno), one(countries), one(countries)}
	}
	return out
}

// EncodeAll encodes queries into one contiguous batch.
func (e *Engine) EncodeAll(qs [][]string) ([]byte, error) {
	out := make([]byte, 0, len(qs)*QuerySize)
	for i, q := range qs {
		b, err := e.Encode(q)
		if err != nil {
			return nil, fmt.Errorf("query %d: %w", i, err)
		}
		out = append(out, b[:]...)
	}
	return out, nil
}
