package main

import (
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane"
)

// TestParseQuotas: rialto server --quota, repeated: a default, per-tenant
// overrides, the last of each winning, and bad specs refused.
func TestParseQuotas(t *testing.T) {
	q, err := parseQuotas([]string{"leases=5", "alice:slots=2", "*:leases=10,bytes=1GiB", "alice:slots=3,bandwidth=100MB"})
	if err != nil {
		t.Fatal(err)
	}
	want := controlplane.Quotas{Default: controlplane.Quota{Leases: 10, Bytes: 1 << 30},
		Tenants: map[string]controlplane.Quota{"alice": {Slots: 3 * api.SlotUnits, Bandwidth: 100e6}}}
	if q.Default != want.Default || len(q.Tenants) != 1 || q.Tenants["alice"] != want.Tenants["alice"] {
		t.Fatalf("got %+v, want %+v", q, want)
	}
	if _, err := parseQuotas([]string{"bob:gpus=1"}); err == nil || !strings.Contains(err.Error(), "unknown limit") {
		t.Fatalf("bad spec: %v", err)
	}
}
