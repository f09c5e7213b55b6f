package sim

import (
	"math"
	"math/rand/v2"
	"sort"
)

// Zipf draws ranks 0..n-1 with P(rank i) ∝ 1/(i+1)^s, for any s ≥ 0 (the
// standard library's generator needs s > 1).
type Zipf struct {
	cdf []float64
}

// NewZipf builds the sampler for n keys.
func NewZipf(n int, s float64) *Zipf {
	z := &Zipf{cdf: make([]float64, n)}
	sum := 0.0
	for i := 0; i < n; i++ {
		sum += math.Pow(float64(i+1), -s)
		z.cdf[i] = sum
	}
	for i := range z.cdf {
		z.cdf[i] /= sum
	}
	return z
}

// Draw returns a rank.
func (z *Zipf) Draw(r *rand.Rand) int {
	u := r.Float64()
	return sort.SearchFloat64s(z.cdf, u)
}

// LRU is a least-recently-used set of integer keys with a fixed capacity.
type LRU struct {
	cap        int
	prev, next []int32 // doubly linked list over key slots; -1 ends
	in         []bool
	head, tail int32
	size       int
}

// NewLRU returns an empty cache for keys in [0, keys) holding up to capacity.
func NewLRU(keys, capacity int) *LRU {
	c := &LRU{cap: capacity, prev: make([]int32, keys), next: make([]int32, keys), in: make([]bool, keys), head: -1, tail: -1}
	return c
}

func (c *LRU) unlink(k int32) {
	if c.prev[k] >= 0 {
		c.next[c.prev[k]] = c.next[k]
	} else {
		c.head = c.next[k]
	}
	if c.next[k] >= 0 {
		c.prev[c.next[k]] = c.prev[k]
	} else {
		c.tail = c.prev[k]
	}
}

func (c *LRU) pushFront(k int32) {
	c.prev[k] = -1
	c.next[k] = c.head
	if c.head >= 0 {
		c.prev[c.head] = k
	}
	c.head = k
	if c.tail < 0 {
		c.tail = k
	}
}

// Get reports whether k is cached and, if not, inserts it (evicting the
// least recently used key when full).
func (c *LRU) Get(key int) bool {
	k := int32(key)
	if c.in[k] {
		c.unlink(k)
		c.pushFront(k)
		return true
	}
	if c.cap <= 0 {
		return false
	}
	if c.size == c.cap {
		t := c.tail
		c.unlink(t)
		c.in[t] = false
		c.size--
	}
	c.in[k] = true
	c.pushFront(k)
	c.size++
	return false
}

// RedisSpec is a Redis-like cache in front of a database (Fig. 14 of
// Venice, Dong et al.):
// queries pick keys with Zipf popularity; a hit is served from the cache's
// memory (local or borrowed), a miss goes to the database and fills the
// cache. Memory beyond BaseBytes holds items.
type RedisSpec struct {
	Keys      int     // distinct keys
	ItemBytes float64 // bytes per cached item
	BaseBytes float64 // memory Redis needs before holding any item
	ZipfS     float64 // popularity skew
	HitLocal  Time    // seconds per hit with the item in local memory
	HitRemote Time    // seconds per hit with the item in borrowed memory
	Miss      Time    // seconds per miss (database query and fill)
	Queries   int     // measured queries
	Warmup    int     // queries before measuring
}

// DefaultRedis is tuned to Venice's testbed: 10,000 queries
// take 11,900 s with 70 MB and 758 s with 350 MB (about 5% misses), and all
// local memory is 7% faster than borrowed memory at 350 MB.
var DefaultRedis = RedisSpec{
	Keys: 77000, ItemBytes: 4096, BaseBytes: 54e6, ZipfS: 0.2,
	HitLocal: 11.4e-3, HitRemote: 16.6e-3, Miss: 1.25,
	Queries: 10000, Warmup: 50000,
}

// RedisOutcome is one run of the cache.
type RedisOutcome struct {
	Seconds Time
	HitRate float64
}

// RunRedis runs the cache with memBytes of memory of which localBytes are
// local (the rest borrowed) on a fresh engine. A hit lands in local memory
// with probability equal to the local share of item memory.
func RunRedis(spec RedisSpec, memBytes, localBytes float64, seed uint64) (RedisOutcome, uint64) {
	r := newRand(seed)
	z := NewZipf(spec.Keys, spec.ZipfS)
	items := int((memBytes - spec.BaseBytes) / spec.ItemBytes)
	if items < 0 {
		items = 0
	}
	localItems := (localBytes - spec.BaseBytes) / spec.ItemBytes
	localShare := 0.0
	if items > 0 {
		localShare = math.Max(0, math.Min(1, localItems/float64(items)))
	}
	c := NewLRU(spec.Keys, items)
	// Start from the steady state's neighbourhood (the most popular keys,
	// hottest most recent), then warm up with real draws.
	for k := min(items, spec.Keys) - 1; k >= 0; k-- {
		c.Get(k)
	}
	for i := 0; i < spec.Warmup; i++ {
		c.Get(z.Draw(r))
	}
	var e Engine
	hits, done := 0, 0
	var next func()
	next = func() {
		if done == spec.Queries {
			return
		}
		done++
		d := spec.Miss
		if c.Get(z.Draw(r)) {
			hits++
			d = spec.HitRemote
			if r.Float64() < localShare {
				d = spec.HitLocal
			}
		}
		e.After(d, next)
	}
	e.At(0, next)
	e.Run(0)
	return RedisOutcome{Seconds: e.Now(), HitRate: float64(hits) / float64(spec.Queries)}, e.Events()
}
