package controlplane

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/placement"
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
	if req.Size == 0 && req.Kind != api.KindAccel || len(req.Labels) > 0 {
		return firstFit(inv, req, skip, now)
	}
	snap, exclusive := snapshot(inv, skip)
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
		AllowCompose: req.Mode == api.ModeComposed || count > 1,
		Affinity:     req.Affinity, AntiAffinity: req.AntiAffinity, Tenant: "", Strategy: req.Strategy,
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
	pp, err := placement.Place(snap, preq)
	if err != nil {
		plan := api.Plan{At: now, State: "infeasible", Explanation: head}
		var ie *placement.InfeasibleError
		switch {
		case errors.As(err, &ie):
			plan.Explanation = append(plan.Explanation, "placement: infeasible ("+ie.Constraint+"): "+ie.Detail)
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
func snapshot(inv store.Inventory, skip map[string]string) (*placement.Snapshot, map[string]bool) {
	s := &placement.Snapshot{Nodes: []placement.Node{{ID: cpVertex, State: placement.NodeReady}}}
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
			s.Leases = append(s.Leases, placement.Lease{ID: p.LeaseID, Tenant: p.Tenant, Borrower: cpVertex, Mode: string(p.Mode)})
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
