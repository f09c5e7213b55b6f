package controlplane

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/placement"
	"github.com/rialto-project/rialto/internal/resource"
)

// cpVertex is the control plane in the fabric graph, and the borrower of
// leases whose borrower is not a known node.
const cpVertex = "controlplane"

// lanVertex is the switch every node is assumed to hang off when it has not
// reported links: the control plane sees a flat LAN.
const lanVertex = "lan"

// policyPlace places with internal/placement (fewest hops, bandwidth-aware,
// share vs compose vs dedicate), building its snapshot from the inventory.
// Requests outside that package's model (whole-device requests of size 0,
// exclusive devices, label selectors) fall back to firstFit; the plan's
// explanation says which policy decided.
func policyPlace(inv store.Inventory, req api.LeaseRequest, skip map[string]string, now time.Time) (api.Plan, error) {
	return policyPlaceWith(inv, req, skip, now, nil)
}

// indexSource returns a placement index over inv as snapshot(inv, nil,
// now) would build it, and the exclusive devices; nil when it has none to
// offer (the caller then builds one for the request).
type indexSource func(inv store.Inventory, now time.Time) (*placement.Index, map[string]bool)

// policyPlaceWith is policyPlace, taking its index from src when the
// request neither skips nodes nor pins devices (both change the snapshot).
func policyPlaceWith(inv store.Inventory, req api.LeaseRequest, skip map[string]string, now time.Time, src indexSource) (api.Plan, error) {
	if req.Size == 0 && req.Kind != api.KindAccel || len(req.Labels) > 0 {
		return firstFit(inv, req, skip, now)
	}
	pins, err := devicePins(inv, req)
	if err != nil {
		return api.Plan{At: now, State: "infeasible", Explanation: []string{err.Error()}}, err
	}
	var x *placement.Index
	var exclusive map[string]bool
	if src != nil && len(skip) == 0 && pins == nil {
		x, exclusive = src(inv, now)
	}
	var snap *placement.Snapshot
	if x == nil {
		snap, exclusive = snapshot(inv, skip, now)
	}
	borrower := cpVertex
	for _, n := range inv.Nodes {
		if n.ID == req.Borrower && n.State == api.NodeReady {
			borrower = n.ID
		}
	}
	count := req.Count
	if count < 1 {
		count = 1
	}
	size := req.Size
	if req.Kind == api.KindAccel {
		size = int64(count)
	}
	preq := placement.Request{
		Kind: string(req.Kind), Size: size, Borrower: borrower, Bandwidth: req.Bandwidth,
		MaxLatency: time.Duration(req.MaxLatencyUs * float64(time.Microsecond)), Work: req.Work,
		Mode: string(req.Mode), AllowShare: req.Mode == "" || req.Mode == api.ModeShared,
		// With no mode given, placement weighs composing block devices
		// against sharing or dedicating one (seed 000, Fig. 8).
		AllowCompose: req.Mode == api.ModeComposed || count > 1 || (req.Mode == "" && req.Kind == api.KindBlock),
		Affinity:     req.Affinity, AntiAffinity: req.AntiAffinity, Tenant: "", Strategy: req.Strategy,
	}
	if pins != nil && snap != nil {
		// Placement matches affinity terms against nodes: the device pins
		// are applied here instead, by hiding every other device.
		preq.Affinity = nil
		for _, t := range req.Affinity {
			if _, ok := pins[t]; !ok {
				preq.Affinity = append(preq.Affinity, t)
			}
		}
		for i := range snap.Devices {
			if _, ok := pins[snap.Devices[i].ID]; !ok && snap.Devices[i].State == "" {
				snap.Devices[i].State = "not pinned"
			}
		}
	}
	if req.DeadlineSecond > 0 {
		preq.Deadline = time.Duration(req.DeadlineSecond * float64(time.Second))
	}
	if req.Mode == "" && count > 1 && req.Kind != api.KindAccel {
		preq.Mode = string(api.ModeComposed)
	}
	if preq.Mode == string(api.ModeComposed) && count > 1 && req.Kind != api.KindAccel {
		preq.Width = count
	}
	var head []string
	for _, id := range sortedKeys(skip) {
		head = append(head, fmt.Sprintf("skipped node %s: %s", id, skip[id]))
	}
	if x == nil {
		x = placement.NewIndex(snap)
	}
	pp, err := x.Place(preq)
	if err != nil {
		plan := api.Plan{At: now, State: "infeasible", Explanation: head}
		var ie *placement.InfeasibleError
		switch {
		case errors.As(err, &ie):
			plan.Explanation = append(plan.Explanation, "placement: infeasible ("+ie.Constraint+"): "+ie.Detail)
			if pins != nil {
				why := pinReasons(inv, req, pins, skip)
				plan.Explanation = append(plan.Explanation, why...)
				if len(why) > 0 {
					return plan, fmt.Errorf("%w: %s", ErrInfeasible, strings.Join(why, "; "))
				}
			}
			for _, r := range ie.Rejections {
				plan.Explanation = append(plan.Explanation, fmt.Sprintf("  %s: %s", r.Candidate, r.Reason))
			}
			return plan, fmt.Errorf("%w: %v", ErrInfeasible, err)
		case errors.Is(err, placement.ErrInvalid):
			return plan, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		return plan, err
	}
	for _, p := range pp.Parts {
		if exclusive[p.DeviceID] && pp.Mode != placement.ModeDedicated {
			return firstFit(inv, req, skip, now) // outside the policy's model
		}
	}
	plan := api.Plan{Mode: api.Mode(pp.Mode), At: now, State: "feasible", Explanation: append(head, pp.Explanation...)}
	for _, p := range pp.Parts {
		plan.Parts = append(plan.Parts, api.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
	}
	if !math.IsInf(pp.PredictedBandwidth, 0) {
		plan.PredictedBandwidth = pp.PredictedBandwidth
	}
	plan.PredictedCompletion = pp.PredictedCompletion.Seconds()
	for _, im := range pp.Impacts {
		plan.Impacts = append(plan.Impacts, api.Impact{LeaseID: im.LeaseID, BandwidthBefore: im.BandwidthBefore, BandwidthAfter: im.BandwidthAfter,
			CompletionBefore: im.CompletionBefore.Seconds(), CompletionAfter: im.CompletionAfter.Seconds()})
	}
	return plan, nil
}

// snapshot converts the inventory to placement's model. Skipped nodes are
// presented as down so that they are never chosen. It also returns the
// exclusive devices, which placement does not model.
func snapshot(inv store.Inventory, skip map[string]string, now time.Time) (*placement.Snapshot, map[string]bool) {
	s := &placement.Snapshot{Now: time.Duration(now.UnixNano()), Nodes: []placement.Node{{ID: cpVertex, State: placement.NodeReady}}}
	if len(inv.Profiles) > 0 {
		s.Profiles = make(map[string]placement.Profile, len(inv.Profiles))
		for _, p := range inv.Profiles {
			s.Profiles[p.Model] = placementProfile(p)
		}
	}
	hasLink := map[string]bool{}
	for _, l := range inv.Links {
		down := l.Status != "up"
		lat := time.Duration(l.RTTMicros / 2 * float64(time.Microsecond))
		if l.To == cpVertex {
			// A node's path to the control plane: node — lan — control plane.
			s.Links = append(s.Links, fabric.Link{ID: l.ID, A: l.From, B: lanVertex, Kind: fabric.Ethernet, Bandwidth: float64(l.BandwidthBps), Latency: lat, Down: down})
			hasLink[l.From] = true
		}
	}
	s.Links = append(s.Links, fabric.Link{ID: "lan-cp", A: lanVertex, B: cpVertex, Kind: fabric.Ethernet})
	for _, n := range inv.Nodes {
		st := string(n.State)
		if skip[n.ID] != "" {
			st = placement.NodeDown
		}
		s.Nodes = append(s.Nodes, placement.Node{ID: n.ID, State: st, Labels: n.Labels})
		if !hasLink[n.ID] {
			s.Links = append(s.Links, fabric.Link{ID: n.ID + ">lan", A: n.ID, B: lanVertex, Kind: fabric.Ethernet})
		}
	}
	exclusive := map[string]bool{}
	for _, d := range inv.Devices {
		st := ""
		if d.State != "available" {
			st = d.State
		}
		if d.Sharing == "exclusive" {
			exclusive[d.ID] = true
		}
		s.Devices = append(s.Devices, placement.Device{ID: d.ID, Node: d.NodeID, Kind: string(d.Kind), Model: d.Model, Capacity: d.Capacity, State: st})
	}
	byLease := map[string]int{}
	for _, p := range inv.Parts {
		i, ok := byLease[p.LeaseID]
		if !ok {
			i = len(s.Leases)
			byLease[p.LeaseID] = i
			l := placement.Lease{ID: p.LeaseID, Tenant: p.Tenant, Borrower: cpVertex, Mode: string(p.Mode),
				Demand: p.Demand.Bandwidth, Remaining: p.Demand.Work}
			if !p.Demand.Deadline.IsZero() {
				l.Deadline = time.Duration(p.Demand.Deadline.UnixNano())
			}
			s.Leases = append(s.Leases, l)
		}
		s.Leases[i].Parts = append(s.Leases[i].Parts, placement.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
	}
	kind := make(map[string]string, len(inv.Devices))
	for _, d := range inv.Devices {
		kind[d.ID] = string(d.Kind)
	}
	for i := range s.Leases {
		s.Leases[i].Kind = kind[s.Leases[i].Parts[0].DeviceID]
	}
	return s, exclusive
}

// placementProfile converts a stored profile to placement's: the write
// curve is the delivered bandwidth by concurrency, its best point the
// device's maximum.
func placementProfile(p api.Profile) placement.Profile {
	pp := placement.Profile{Model: p.Model, Delivered: p.WriteBps, Latency: time.Duration(p.Latency4KUs * float64(time.Microsecond))}
	for _, b := range p.WriteBps {
		pp.MaxBandwidth = max(pp.MaxBandwidth, b)
	}
	return pp
}

// devicePins returns the devices a request is pinned to: affinity terms
// that name a device ID (nil when none do). A pinned request is placed
// only on those devices. A term that names no device is left to node and
// label matching; a request pinned to a device of another kind is invalid.
func devicePins(inv store.Inventory, req api.LeaseRequest) (map[string]api.Device, error) {
	if len(req.Affinity) == 0 {
		return nil, nil
	}
	var pins map[string]api.Device
	for _, t := range req.Affinity {
		for _, d := range inv.Devices {
			if d.ID != t {
				continue
			}
			if d.Kind != req.Kind {
				return nil, fmt.Errorf("%w: affinity pins device %s, which is %s, not %s", ErrInfeasible, d.ID, d.Kind, req.Kind)
			}
			if pins == nil {
				pins = map[string]api.Device{}
			}
			pins[d.ID] = d
		}
	}
	return pins, nil
}

// pinReasons says why each pinned device cannot take the request, as far
// as the inventory tells.
func pinReasons(inv store.Inventory, req api.LeaseRequest, pins map[string]api.Device, skip map[string]string) []string {
	nodes := make(map[string]api.Node, len(inv.Nodes))
	for _, n := range inv.Nodes {
		nodes[n.ID] = n
	}
	used := map[string]int{}
	for _, p := range inv.Parts {
		used[p.DeviceID]++
	}
	var out []string
	for _, id := range sortedKeys(pinKeys(pins)) {
		d := pins[id]
		n, ok := nodes[d.NodeID]
		var why string
		switch {
		case !ok:
			why = "its node " + d.NodeID + " is unknown"
		case n.State != api.NodeReady:
			why = fmt.Sprintf("its node %s is %s", n.Name, n.State)
		case skip[n.ID] != "":
			why = fmt.Sprintf("its node %s was skipped: %s", n.Name, skip[n.ID])
		case d.State != "available":
			why = "it is " + d.State
		case used[d.ID] > 0 && (req.Mode == api.ModeDedicated || req.Size == 0 || d.Sharing == "exclusive"):
			why = fmt.Sprintf("it is in use by %d lease part(s)", used[d.ID])
		case req.Size > d.Capacity-d.Allocated:
			why = fmt.Sprintf("it has %s free, %s wanted", resource.FormatSize(d.Capacity-d.Allocated), sizeText(req))
		default:
			continue
		}
		out = append(out, fmt.Sprintf("pinned device %s (%s): %s", d.ID, d.Name, why))
	}
	return out
}

func pinKeys(pins map[string]api.Device) map[string]string {
	m := make(map[string]string, len(pins))
	for k := range pins {
		m[k] = k
	}
	return m
}
