package controlplane

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/placement"
	"github.com/rialto-project/rialto/internal/resource"
)

// Quota bounds a tenant's reserved and active leases: their number, the
// block and memory bytes they hold (a whole device counts whole), the
// accel slots in slot units (api.SlotUnits a slot: a shared lease counts
// its share), and the sum of their declared bandwidths (bytes/s). Zero
// fields are unlimited. Placement enforces it (internal/placement).
type Quota = placement.Quota

// Quotas are the per-tenant quotas: Tenants[t] for a tenant listed there,
// else Default (the zero Quota: unlimited).
type Quotas struct {
	Default Quota
	Tenants map[string]Quota
}

// ParseQuota parses a quota spec, "[TENANT:]KEY=VALUE,…" with keys leases
// (a count), bytes (a size such as 100GiB), slots (slots, fractions
// counting shared leases' shares: 2.5) and bandwidth (a rate as
// --bandwidth takes it, resource.ParseRate: 2GB/s, 800Mbit/s, or bytes/s
// written as a size, 1GB). Without a tenant, or with "*", it is the
// default quota (tenant "").
func ParseQuota(spec string) (tenant string, q Quota, err error) {
	body := spec
	if i := strings.IndexByte(spec, ':'); i >= 0 {
		tenant, body = spec[:i], spec[i+1:]
		if tenant == "*" {
			tenant = ""
		} else if tenant == "" {
			return "", q, fmt.Errorf("quota %q: empty tenant (use * or no prefix for the default)", spec)
		}
	}
	if strings.TrimSpace(body) == "" {
		return "", q, fmt.Errorf("quota %q: no limits (leases=N,bytes=SIZE,slots=N,bandwidth=RATE)", spec)
	}
	for _, kv := range strings.Split(body, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return "", q, fmt.Errorf("quota %q: %q is not KEY=VALUE", spec, kv)
		}
		var n int64
		switch k {
		case "leases":
			n, err = strconv.ParseInt(v, 10, 64)
			if err == nil && (n < 0 || n > math.MaxInt32) {
				err = errors.New("out of range")
			}
		case "slots":
			// Slots and shares of one: counted in slot units.
			var f float64
			f, err = strconv.ParseFloat(v, 64)
			if err == nil && (math.IsNaN(f) || f < 0 || f > math.MaxInt32) {
				err = errors.New("out of range")
			}
			n = int64(math.Round(f * api.SlotUnits))
		case "bytes":
			n, err = resource.ParseSize(v)
		case "bandwidth":
			var f float64
			f, err = resource.ParseRate(v)
			n = int64(math.Round(f))
		default:
			return "", q, fmt.Errorf("quota %q: unknown limit %q (leases, bytes, slots, bandwidth)", spec, k)
		}
		if err != nil {
			return "", q, fmt.Errorf("quota %q: bad %s: %w", spec, k, err)
		}
		switch k {
		case "leases":
			q.Leases = int(n)
		case "slots":
			q.Slots = n
		case "bytes":
			q.Bytes = n
		case "bandwidth":
			q.Bandwidth = float64(n)
		}
	}
	return tenant, q, nil
}
