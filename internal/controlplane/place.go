package controlplane

import (
	"sort"
	"strconv"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/resource"
)

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
		if req.Whole {
			return "a whole device"
		}
		if req.Count > 1 {
			return strconv.Itoa(req.Count) + " slots"
		}
		return "1 slot"
	}
	if req.Size == 0 || req.Whole {
		return "a whole device"
	}
	return resource.FormatSize(req.Size)
}
