package controlplane

import (
	"errors"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/httpapi"
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
		if err := httpapi.Decode(strings.NewReader(in), httpapi.MaxBody, false, &r); err != nil {
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
		if err := httpapi.Decode(strings.NewReader(in), httpapi.MaxBody, false, &r); err != nil {
			return
		}
		if err := validateJoin(r); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("validation error is not ErrInvalid: %v", err)
		}
	})
}
