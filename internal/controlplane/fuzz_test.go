package controlplane

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/httpx"
)

// FuzzLeaseRequest decodes and validates arbitrary lease requests: no
// panics, and every refusal is an invalid-request error.
func FuzzLeaseRequest(f *testing.F) {
	for _, s := range []string{`{"kind":"block","size":268435456}`, `{"kind":"block","mode":"composed","count":1}`,
		`{"kind":"memory","ttl_seconds":-5}`, `{"kind":"accel","stripe_unit":3}`, `{"kind":"block","count":100000}`} {
		f.Add(s)
	}
	s := &Server{cfg: Config{MaxTTL: 24 * 3600 * 1e9}}
	f.Fuzz(func(t *testing.T, in string) {
		var r api.LeaseRequest
		if err := httpx.Decode(strings.NewReader(in), maxBody, &r); err != nil {
			return
		}
		if err := s.validateLeaseRequest(&r); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("validation error is not ErrInvalid: %v", err)
		}
		_ = requestHash(r)
	})
}

// FuzzJoinRequest validates arbitrary join requests without panicking.
func FuzzJoinRequest(f *testing.F) {
	f.Add(`{"name":"n","fingerprint":{"machine_id":"m"},"agent_url":"http://127.0.0.1:1","devices":[{"name":"d","kind":"block","capacity":1}]}`)
	f.Add(`{"name":"n","fingerprint":{"machine_id":"m"},"agent_url":"::bad"}`)
	f.Fuzz(func(t *testing.T, in string) {
		var r api.JoinRequest
		if err := httpx.Decode(strings.NewReader(in), maxBody, &r); err != nil {
			return
		}
		if err := validateJoin(r); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("validation error is not ErrInvalid: %v", err)
		}
	})
}

// TestDecodeEmpty: a body a route may omit (allowEmpty) may be empty or
// null, leaving the value as it was; any other route refuses both, and
// every route refuses what is not one strict JSON object.
func TestDecodeEmpty(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in         string
		allowEmpty bool
		ok         bool
	}{
		{`{"kind":"block","size":1}`, false, true},
		{`  `, true, true},
		{``, false, false},
		{`null`, false, false},
		{` null `, true, true},
		{`{}`, false, true},
		{`{"kind":"block"} {}`, true, false},
		{`{"kind":"block","extra":1}`, true, false},
		{`{"kind":"block","size":"x"}`, false, false},
		{`{"kind":`, false, false},
		{`[]`, true, false},
		{`{"size":1e400}`, false, false},
		{`{"kind":"` + strings.Repeat("a", maxBody) + `"}`, true, false},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/leases", strings.NewReader(c.in))
		req := api.LeaseRequest{Kind: "keep"}
		err := decode(httptest.NewRecorder(), r, c.allowEmpty, &req)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, httpx.ErrBadBody)) {
			t.Errorf("%.40q (allowEmpty %v): %v", c.in, c.allowEmpty, err)
		}
		if in := strings.TrimSpace(c.in); err == nil && (in == "" || in == "null") && req.Kind != "keep" {
			t.Errorf("%q overwrote the value: %+v", c.in, req)
		}
	}
}

// FuzzDecodeHeartbeat decodes arbitrary heartbeats: every refusal wraps
// httpx.ErrBadBody.
func FuzzDecodeHeartbeat(f *testing.F) {
	for _, s := range []string{`{"health":"ok","leases":["lease-1"],"links":[{"to":"controlplane","rtt_us":12.5,"up":true}]}`, `{"leases":null}`, `null`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var h api.Heartbeat
		if err := httpx.Decode(strings.NewReader(in), maxBody, &h); err != nil && !errors.Is(err, httpx.ErrBadBody) {
			t.Fatalf("error not wrapped: %v", err)
		}
	})
}
