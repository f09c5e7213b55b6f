package controlplane

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

// placer decides a plan for a request over an inventory. skip names nodes
// that must not be used (node ID → why), e.g. lenders that did not confirm.
type placer func(inv store.Inventory, req api.LeaseRequest, skip map[string]string, now time.Time) (api.Plan, error)

const defaultStripeUnit = 1 << 20

// gap is a free range of a device.
type gap struct{ off, len int64 }

type candidate struct {
	dev  api.Device
	node api.Node
	free []gap // sorted by offset
	used int   // live parts
}

func alignUp(v, a int64) int64 {
	if a <= 1 {
		return v
	}
	return (v + a - 1) / a * a
}

// firstFit is the built-in placement: the first usable device in
// inventory order (node name, device name), honouring mode, affinities and
// skipped nodes; "spread" prefers the least used devices. It is the
// fallback when the placement package has nothing better to say.
func firstFit(inv store.Inventory, req api.LeaseRequest, skip map[string]string, now time.Time) (api.Plan, error) {
	plan := api.Plan{At: now, State: "infeasible"}
	explain := func(f string, a ...any) { plan.Explanation = append(plan.Explanation, fmt.Sprintf(f, a...)) }
	for _, id := range sortedKeys(skip) {
		explain("skipped node %s: %s", id, skip[id])
	}
	pins, err := devicePins(inv, req)
	if err != nil {
		explain("%v", err)
		return plan, err
	}
	// infeasible explains a failure, naming why pinned devices did not do.
	infeasible := func(f string, a ...any) error {
		msg := fmt.Sprintf(f, a...)
		if pins != nil {
			if why := pinReasons(inv, req, pins, skip); len(why) > 0 {
				plan.Explanation = append(plan.Explanation, why...)
				msg += ": " + strings.Join(why, "; ")
			} else {
				msg += " on the pinned device(s)"
			}
		}
		return fmt.Errorf("%w: %s", ErrInfeasible, msg)
	}
	nodes := map[string]api.Node{}
	for _, n := range inv.Nodes {
		nodes[n.ID] = n
	}
	partsBy := map[string][]store.LivePart{}
	for _, p := range inv.Parts {
		partsBy[p.DeviceID] = append(partsBy[p.DeviceID], p)
	}
	align := int64(4096)
	if req.Kind == api.KindAccel {
		align = 1
	}
	var cands []candidate
	seenKind := 0
	for _, d := range inv.Devices {
		if d.Kind != req.Kind {
			continue
		}
		seenKind++
		if _, ok := pins[d.ID]; pins != nil && !ok {
			continue
		}
		n, ok := nodes[d.NodeID]
		switch {
		case !ok:
			continue
		case n.State != api.NodeReady:
			continue
		case skip[n.ID] != "":
			continue
		case d.State != "available":
			continue
		case slices.Contains(req.AntiAffinity, n.ID) || slices.Contains(req.AntiAffinity, n.Name):
			continue
		case !labelsMatch(n.Labels, req.Labels):
			continue
		}
		ps := partsBy[d.ID]
		sort.Slice(ps, func(i, j int) bool { return ps[i].Offset < ps[j].Offset })
		var free []gap
		at := int64(0)
		for _, p := range ps {
			if start := alignUp(at, align); p.Offset > start {
				free = append(free, gap{start, p.Offset - start})
			}
			if e := p.Offset + p.Length; e > at {
				at = e
			}
		}
		if start := alignUp(at, align); d.Capacity > start {
			free = append(free, gap{start, d.Capacity - start})
		}
		cands = append(cands, candidate{dev: d, node: n, free: free, used: len(ps)})
	}
	// Affinity first, then the strategy's order; stable so first-fit holds.
	pref := func(c candidate) int {
		if slices.Contains(req.Affinity, c.node.ID) || slices.Contains(req.Affinity, c.node.Name) || slices.Contains(req.Affinity, c.dev.ID) {
			return 0
		}
		return 1
	}
	sort.SliceStable(cands, func(i, j int) bool {
		pi, pj := pref(cands[i]), pref(cands[j])
		if pi != pj {
			return pi < pj
		}
		if req.Strategy == "spread" {
			return cands[i].used < cands[j].used
		}
		if req.Strategy == "binpack" {
			return cands[i].used > cands[j].used
		}
		return false
	})
	if len(cands) == 0 {
		explain("no ready, available %s device (%d %s devices known)", req.Kind, seenKind, req.Kind)
		return plan, infeasible("no ready, available %s device", req.Kind)
	}

	count := req.Count
	if count < 1 {
		count = 1
	}
	mode := req.Mode
	if mode == "" {
		switch {
		case count > 1:
			mode = api.ModeComposed
		case req.Size == 0 && req.Kind != api.KindAccel:
			mode = api.ModeDedicated
		default:
			mode = api.ModeShared
		}
		explain("mode %s chosen: count %d, size %s", mode, count, sizeText(req))
	}
	plan.Mode = mode
	partitionable := func(d api.Device) bool { return d.Sharing != "exclusive" }
	unit := func() int64 {
		if req.Kind == api.KindAccel {
			return 1
		}
		return req.Size
	}
	fits := func(c candidate, length int64) (int64, bool) {
		for _, g := range c.free {
			if g.len >= length {
				return g.off, true
			}
		}
		return 0, false
	}
	var parts []api.Part
	switch mode {
	case api.ModeDedicated:
		for _, c := range cands {
			if c.used == 0 && c.dev.Capacity >= req.Size && c.dev.Capacity > 0 {
				parts = []api.Part{{NodeID: c.node.ID, DeviceID: c.dev.ID, Offset: 0, Length: c.dev.Capacity}}
				explain("dedicated: node %s device %s (%s, unused)", c.node.Name, c.dev.Name, capText(c.dev))
				break
			}
		}
	case api.ModeShared:
		if count > 1 {
			explain("shared leases have one part; use composed for count %d", count)
			return plan, fmt.Errorf("%w: mode shared takes count 1", ErrInvalid)
		}
		for _, c := range cands {
			if !partitionable(c.dev) {
				continue
			}
			if off, ok := fits(c, unit()); ok {
				parts = []api.Part{{NodeID: c.node.ID, DeviceID: c.dev.ID, Offset: off, Length: unit()}}
				explain("shared: node %s device %s offset %d (%s)", c.node.Name, c.dev.Name, off, capText(c.dev))
				break
			}
		}
		if parts == nil && req.Mode == "" {
			// Auto mode: a whole unused device that is large enough also does.
			for _, c := range cands {
				if c.used == 0 && c.dev.Capacity >= unit() {
					parts = []api.Part{{NodeID: c.node.ID, DeviceID: c.dev.ID, Offset: 0, Length: c.dev.Capacity}}
					plan.Mode = api.ModeDedicated
					explain("no partitionable room; dedicated: node %s device %s", c.node.Name, c.dev.Name)
					break
				}
			}
		}
	case api.ModeComposed:
		if count < 2 {
			count = 2
		}
		per := unit()
		if req.Kind != api.KindAccel {
			if req.Size <= 0 {
				explain("composed leases need a size")
				return plan, fmt.Errorf("%w: composed leases need a size", ErrInvalid)
			}
			su := req.StripeUnit
			if su <= 0 {
				su = defaultStripeUnit
			}
			per = alignUp((req.Size+int64(count)-1)/int64(count), su)
		}
		// Distinct devices, preferring distinct nodes.
		used := map[string]bool{}
		usedNode := map[string]bool{}
		for pass := 0; pass < 2 && len(parts) < count; pass++ {
			for _, c := range cands {
				if len(parts) == count {
					break
				}
				if used[c.dev.ID] || (pass == 0 && usedNode[c.node.ID]) || !partitionable(c.dev) {
					continue
				}
				if off, ok := fits(c, per); ok {
					parts = append(parts, api.Part{NodeID: c.node.ID, DeviceID: c.dev.ID, Offset: off, Length: per})
					used[c.dev.ID], usedNode[c.node.ID] = true, true
					explain("composed part %d: node %s device %s offset %d length %d", len(parts)-1, c.node.Name, c.dev.Name, off, per)
				}
			}
		}
		if len(parts) < count {
			explain("composed: only %d of %d devices have %d free bytes", len(parts), count, per)
			parts = nil
		}
	default:
		return plan, fmt.Errorf("%w: unknown mode %q", ErrInvalid, mode)
	}
	if parts == nil {
		explain("no %s device has room for %s in mode %s", req.Kind, sizeText(req), mode)
		return plan, infeasible("no %s device has room for %s (mode %s)", req.Kind, sizeText(req), mode)
	}
	plan.Parts = parts
	plan.State = "feasible"
	return plan, nil
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

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
		return "1 slot"
	}
	if req.Size == 0 {
		return "a whole device"
	}
	return resource.FormatSize(req.Size)
}

func capText(d api.Device) string {
	if d.Kind == api.KindAccel {
		return fmt.Sprintf("%d/%d slots used", d.Allocated, d.Capacity)
	}
	return resource.FormatSize(d.Allocated) + " of " + resource.FormatSize(d.Capacity) + " used"
}
