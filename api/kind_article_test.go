package api

import "testing"

// TestKindArticle: messages say "an accel lease" ("a accel lease" was
// seen), "a block lease".
func TestKindArticle(t *testing.T) {
	for k, want := range map[Kind]string{KindBlock: "a", KindMemory: "a", KindAccel: "an", KindNIC: "a", "": "a"} {
		if got := k.Article(); got != want {
			t.Errorf("%q: %q, want %q", k, got, want)
		}
	}
}
