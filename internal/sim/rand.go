package sim

import "math/rand/v2"

// newRand returns a deterministic generator for seed.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
