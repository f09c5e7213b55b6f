package sqlstore

import (
	"testing"
	"time"
)

func TestTimeRoundTrip(t *testing.T) {
	for _, at := range []time.Time{{}, time.Unix(0, 1).UTC(), time.Date(2026, 11, 26, 5, 0, 0, 123, time.UTC)} {
		if got := Time(NS(at)); !got.Equal(at) {
			t.Errorf("%v stored and read back is %v", at, got)
		}
	}
	if NS(time.Time{}) != 0 {
		t.Error("the zero time is not stored as 0")
	}
}

func TestJSON(t *testing.T) {
	in := map[string]string{"a": "b"}
	var out map[string]string
	if err := Unjson(JSON(in), &out); err != nil || out["a"] != "b" {
		t.Fatalf("round trip: %v %v", out, err)
	}
	keep := map[string]string{"k": "v"}
	for _, s := range []string{"", "null"} {
		if err := Unjson(s, &keep); err != nil || keep["k"] != "v" {
			t.Errorf("%q: %v %v", s, keep, err)
		}
	}
	if err := Unjson("{", &out); err == nil {
		t.Error("bad JSON decoded")
	}
}

func TestTextCache(t *testing.T) {
	var c TextCache[int]
	if _, ok := c.Get("x"); ok {
		t.Fatal("empty cache hit")
	}
	c.Put("x", 1)
	if v, ok := c.Get("x"); !ok || v != 1 {
		t.Fatalf("got %v %v", v, ok)
	}
	for i := range maxCachedTexts + 1 {
		c.Put(string(rune('a'+i%26))+string(rune(i)), i)
	}
	if len(c.m) > maxCachedTexts {
		t.Errorf("cache holds %d texts, bound %d", len(c.m), maxCachedTexts)
	}
}
