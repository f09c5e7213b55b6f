package controlplane

import (
	"sort"
	"strconv"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

// placer decides a plan for a request over an inventory. skip names nodes
// that must not be used (node ID → why), e.g. lenders that did not confirm.
// The server's placer is policyPlace: every lease kind is placed by
// internal/placement (see policy.go); there is no other placement.
type placer func(inv store.Inventory, req api.LeaseRequest, skip map[string]string, now time.Time) (api.Plan, error)

const defaultStripeUnit = 1 << 20

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func sizeText(req api.LeaseRequest) string {
	if req.Kind == api.KindAccel {
		if req.Count > 1 {
			return strconv.Itoa(req.Count) + " slots"
		}
		return "1 slot"
	}
	if req.Size == 0 {
		return "a whole device"
	}
	return resource.FormatSize(req.Size)
}
