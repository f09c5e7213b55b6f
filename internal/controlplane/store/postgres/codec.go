package postgres

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func tm(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic("postgres: encode: " + err.Error()) // only maps of strings and api types
	}
	return string(b)
}

func unjs(s string, v any) error {
	if s == "" || s == "null" {
		return nil
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return fmt.Errorf("postgres: decode stored JSON: %w", err)
	}
	return nil
}

// textCache keeps values decoded from stored JSON by their text: a lease's
// plan and parts are read back many times over its life (after every
// transition, on every get), and decoding their JSON was the largest single
// cost of a read. The text is the key, so an entry cannot go stale; the
// cache is bounded (it starts over when full), and callers copy what they
// get before handing it out. The zero value is ready to use; it is safe
// for concurrent use.
type textCache[T any] struct {
	mu sync.Mutex
	m  map[string]T
}

// maxCachedTexts bounds a textCache.
const maxCachedTexts = 4096

func (c *textCache[T]) get(text string) (T, bool) {
	c.mu.Lock()
	v, ok := c.m[text]
	c.mu.Unlock()
	return v, ok
}

func (c *textCache[T]) put(text string, v T) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedTexts {
		c.m = make(map[string]T, 256)
	}
	c.m[text] = v
	c.mu.Unlock()
}
