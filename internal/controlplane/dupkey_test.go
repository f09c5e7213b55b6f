package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/httpx"
)

// duplicateKeyByTokens is what duplicateKey was, on encoding/json's
// tokens: the reference its own scan is held to.
func duplicateKeyByTokens(data []byte) error {
	type object struct {
		keys    map[string]bool
		wantKey bool
	}
	var stack []*object // nil for an array
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		var top *object
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, &object{keys: map[string]bool{}, wantKey: true})
			case '[':
				stack = append(stack, nil)
			default:
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1] != nil {
					stack[len(stack)-1].wantKey = true
				}
			}
		case string:
			if top != nil && top.wantKey {
				k := strings.ToLower(t)
				if top.keys[k] {
					return fmt.Errorf("%w: duplicate key %q", httpx.ErrBadBody, t)
				}
				top.keys[k] = true
				top.wantKey = false
				continue
			}
			if top != nil {
				top.wantKey = true
			}
		default:
			if top != nil {
				top.wantKey = true
			}
		}
	}
}

// dupKeySeeds are documents with and without duplicate keys, in nested
// objects and arrays, in other cases, escaped, not ASCII, in objects
// with many keys.
func dupKeySeeds() []string {
	many := func(n int, dup string) string {
		var b strings.Builder
		b.WriteString(`{"m":{`)
		for i := range n {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		b.WriteString(`"` + dup + `":0}}`)
		return b.String()
	}
	return []string{
		`{"kind":"block","size":1048576,"kind":"memory"}`,
		`{"kind":"block","size":1048576,"Kind":"memory"}`,
		`{"kind":"block","labels":{"a":"1","a":"2"}}`,
		`{"kind":"block","labels":{"a":"1"},"a":"2"}`,
		`{"a":[{"b":1},{"b":2}],"b":{"a":{"a":1}}}`,
		`{"a":[{"b":1,"c":{"b":2}},{"b":2,"B":3}]}`,
		`{"\u006bind":"block","kind":"memory"}`,
		`{"k\"q":1,"K\"Q":2}`,
		`{"K":1,"\u212a":2}`,
		`{"ſ":1,"S":2}`,
		`{"é":1,"É":2}`,
		`{"\xff":1,"\xfe":2}`,
		`{"a\\":1,"a\\\\":2,"A\\":3}`,
		`{"x":"{\"a\":1,\"a\":2}","y":"]}"}`,
		` [ {"a" : 1 , "a" : 2} ] `,
		`[1,"a","a",{"a":[]},{"a":{}}]`,
		`{}`, `[]`, `"a"`, `1`, `null`, `{"":1,"":2}`, `{"":{"":{"":1}}}`,
		many(40, "k3"), many(40, "K39"), many(40, "new"), many(16, "k0"), many(17, "k16"),
	}
}

// TestDuplicateKeyAsTokens: duplicateKey finds what the token-based
// reference finds, and says the same, on documents with and without
// duplicate keys.
func TestDuplicateKeyAsTokens(t *testing.T) {
	t.Parallel()
	for _, in := range dupKeySeeds() {
		want, got := duplicateKeyByTokens([]byte(in)), duplicateKey([]byte(in))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%.80s: %v, want %v", in, got, want)
		}
		if got != nil && !errors.Is(got, httpx.ErrBadBody) {
			t.Errorf("%.80s: %v does not wrap ErrBadBody", in, got)
		}
	}
}

// FuzzDuplicateKey holds duplicateKey to the token-based reference on
// every valid JSON document.
func FuzzDuplicateKey(f *testing.F) {
	for _, s := range dupKeySeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if !json.Valid([]byte(in)) {
			duplicateKey([]byte(in)) // no panic
			return
		}
		want, got := duplicateKeyByTokens([]byte(in)), duplicateKey([]byte(in))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%q: %v, want %v", in, got, want)
		}
	})
}

// TestDuplicateKeyCost: the check of a heartbeat's body that lists a
// thousand exports by part allocates a few buffers, not a few values per
// token (as encoding/json's Decoder.Token did: tens of thousands, half of
// what the heartbeat route allocated).
func TestDuplicateKeyCost(t *testing.T) {
	h := api.Heartbeat{Health: "ok", LeasesComplete: true, ExportsComplete: true}
	for i := range 1000 {
		id := fmt.Sprintf("lease-%012d", i)
		h.Leases = append(h.Leases, id)
		h.Exports = append(h.Exports, api.ServedExport{LeaseID: id, DeviceID: "dev-0123456789ab", Offset: int64(i) << 20, Length: 1 << 20,
			Move: "move-0123456789ab", URI: "nbd://10.0.0.1:10809/rlp_0123456789abcdef0123456789abcdef0123456789a"})
	}
	body, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	if err := duplicateKey(body); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(5, func() { duplicateKey(body) }); n > 32 {
		t.Fatalf("checking a heartbeat of %d bytes for duplicate keys made %.0f allocations", len(body), n)
	}
}
