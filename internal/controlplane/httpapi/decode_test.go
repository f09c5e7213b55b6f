package httpapi

import (
	"errors"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
)

func TestDecode(t *testing.T) {
	for _, c := range []struct {
		in    string
		empty bool
		ok    bool
	}{
		{`{"kind":"block","size":1}`, false, true},
		{`  `, true, true},
		{``, false, false},
		{`null`, false, false},
		{` null `, true, true},
		{`{}`, false, true},
		{`{"kind":"block"} {}`, false, false},
		{`{"kind":"block","extra":1}`, false, false},
		{`{"kind":"block","size":"x"}`, false, false},
		{`{"kind":`, false, false},
		{`[]`, false, false},
		{`{"size":1e400}`, false, false},
		{`{"kind":"` + strings.Repeat("a", 200) + `"}`, false, false}, // over the limit below
	} {
		var r api.LeaseRequest
		err := Decode(strings.NewReader(c.in), 128, c.empty, &r)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrBadBody)) {
			t.Errorf("%q: %v", c.in, err)
		}
	}
}

func fuzzDecode[T any](f *testing.F, seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v T
		err := Decode(strings.NewReader(string(b)), MaxBody, false, &v)
		if err != nil && !errors.Is(err, ErrBadBody) {
			t.Fatalf("error not wrapped: %v", err)
		}
	})
}

func FuzzDecodeLeaseRequest(f *testing.F) {
	fuzzDecode[api.LeaseRequest](f, `{"kind":"block","size":268435456}`, `{"kind":"block","mode":"composed","count":3,"stripe_unit":65536}`,
		`{"kind":"accel","role":"fft","labels":{"a":"b"},"affinity":["n1"]}`, `{}`, `null`, `{"kind":1}`)
}

func FuzzDecodeJoinRequest(f *testing.F) {
	fuzzDecode[api.JoinRequest](f, `{"name":"n1","fingerprint":{"machine_id":"m"},"devices":[{"name":"d","kind":"block","capacity":1}]}`,
		`{"name":"n1","endpoints":{"block":"127.0.0.1:10809"}}`)
}

func FuzzDecodeHeartbeat(f *testing.F) {
	fuzzDecode[api.Heartbeat](f, `{"health":"ok","leases":["lease-1"],"links":[{"to":"controlplane","rtt_us":12.5,"up":true}]}`, `{"leases":null}`)
}
