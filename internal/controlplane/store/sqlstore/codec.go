package sqlstore

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// NS is t as stored: Unix nanoseconds, 0 for the zero time.
func NS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Time is the time NS stored as n, in UTC.
func Time(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// JSON is v as stored JSON text. The stores keep only maps of strings and
// api types, which always encode: a failure is a programming error and
// panics.
func JSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic("store: encode: " + err.Error())
	}
	return string(b)
}

// Unjson decodes stored JSON text s into v; empty text and "null" leave v
// as it is.
func Unjson(s string, v any) error {
	if s == "" || s == "null" {
		return nil
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return fmt.Errorf("store: decode stored JSON: %w", err)
	}
	return nil
}

// TextCache keeps values decoded from stored JSON by their text: a lease's
// plan and parts are read back many times over its life (after every
// transition, on every get), and decoding their JSON was the largest single
// cost of a read. The text is the key, so an entry cannot go stale; the
// cache is bounded (it starts over when full), and callers copy what they
// get before handing it out. The zero value is ready to use; it is safe
// for concurrent use.
type TextCache[T any] struct {
	mu sync.Mutex
	m  map[string]T
}

// maxCachedTexts bounds a TextCache.
const maxCachedTexts = 4096

// Get returns the value decoded from text, if cached.
func (c *TextCache[T]) Get(text string) (T, bool) {
	c.mu.Lock()
	v, ok := c.m[text]
	c.mu.Unlock()
	return v, ok
}

// Put caches v as the value decoded from text.
func (c *TextCache[T]) Put(text string, v T) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedTexts {
		c.m = make(map[string]T, 256)
	}
	c.m[text] = v
	c.mu.Unlock()
}
