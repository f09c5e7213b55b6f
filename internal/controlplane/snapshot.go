package controlplane

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/fabric"
	"github.com/rialto-project/rialto/internal/placement"
	"github.com/rialto-project/rialto/internal/resource"
)

// This file is the adapter between the control plane's inventory and
// internal/placement: it turns the stored inventory into placement's
// snapshot and an API lease request into placement's request, and
// placement's plan (or refusal) back into the API's plan.

// cpVertex is the control plane in the fabric graph, and the borrower of
// leases whose borrower is not a known node.
const cpVertex = "controlplane"

// lanVertex is the switch every node is assumed to hang off when it has not
// reported links: the control plane sees a flat LAN.
const lanVertex = "lan"

// defaultStripeUnit is a composed block lease's stripe unit when the
// request names none.
const defaultStripeUnit = 1 << 20

// withoutLease is inv without a lease's parts: a lease being re-placed
// neither holds its old parts (torn down) nor counts against its tenant's
// quota while it is placed again.
func withoutLease(inv store.Inventory, id string) store.Inventory {
	parts := make([]store.LivePart, 0, len(inv.Parts))
	for _, p := range inv.Parts {
		if p.LeaseID != id {
			parts = append(parts, p)
		}
	}
	inv.Parts = parts
	return inv
}

// indexSource returns a placement index over inv as snapshot(inv, nil,
// now, quotas) would build it; nil when it has none to offer (the caller
// then builds one for the request).
type indexSource func(inv store.Inventory, now time.Time) *placement.Index

// policyPlace places every lease kind with internal/placement (fewest
// hops, bandwidth-aware, share vs compose vs dedicate, whole devices,
// label selectors, exclusive devices, pins, tenant quotas), building its
// snapshot from the inventory. It is the control plane's only placement.
// skip names nodes that must not be used (node ID → why), e.g. lenders
// that did not confirm. The index comes from src (nil: none) when the
// request skips no nodes (skipped nodes change the snapshot).
func policyPlace(inv store.Inventory, req api.LeaseRequest, tenant string, quotas Quotas, skip map[string]string, now time.Time, src indexSource) (api.Plan, error) {
	plan, x, err := placeRequest(inv, req, tenant, quotas, skip, now, src)
	if x == nil {
		return plan, err
	}
	return hideOtherLeases(x.LeaseTenant, tenant, plan, err)
}

// placeRequest is policyPlace before hideOtherLeases; it also returns the
// index it placed with (nil if it did not get that far).
func placeRequest(inv store.Inventory, req api.LeaseRequest, tenant string, quotas Quotas, skip map[string]string, now time.Time, src indexSource) (api.Plan, *placement.Index, error) {
	pins, err := devicePins(inv, req)
	if err != nil {
		return api.Plan{At: now, State: "infeasible", Explanation: []string{err.Error()}}, nil, err
	}
	var x *placement.Index
	if src != nil && len(skip) == 0 {
		x = src(inv, now)
	}
	if x == nil {
		x = placement.NewIndex(snapshot(inv, skip, now, quotas))
	}
	preq, err := placementRequest(inv, req, pins)
	if err != nil {
		return api.Plan{At: now, State: "infeasible", Explanation: []string{err.Error()}}, nil, err
	}
	preq.Tenant = tenant
	var head []string
	for _, id := range sortedKeys(skip) {
		head = append(head, fmt.Sprintf("skipped %s: %s", nodeText(inv, id), skip[id]))
	}
	pp, err := x.Place(preq)
	if err != nil {
		plan, err := infeasiblePlan(inv, pins, head, now, err)
		return plan, x, err
	}
	plan := api.Plan{Mode: leaseMode(req, pp.Mode), At: now, State: "feasible", Explanation: append(head, pp.Explanation...)}
	switch req.Kind {
	case api.KindAccel:
		plan.Explanation = append(plan.Explanation, accelNote(req, pp))
	case api.KindNIC:
		plan.Explanation = append(plan.Explanation, nicNote(inv, pp))
	}
	for _, p := range pp.Parts {
		plan.Parts = append(plan.Parts, api.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
	}
	if !math.IsInf(pp.PredictedBandwidth, 0) {
		plan.PredictedBandwidth = pp.PredictedBandwidth
	}
	plan.PredictedCompletion = pp.PredictedCompletion.Seconds()
	for _, im := range pp.Impacts {
		plan.Impacts = append(plan.Impacts, api.Impact{LeaseID: im.LeaseID, Kind: api.Kind(im.Kind), BandwidthBefore: im.BandwidthBefore, BandwidthAfter: im.BandwidthAfter,
			CompletionBefore: im.CompletionBefore.Seconds(), CompletionAfter: im.CompletionAfter.Seconds()})
	}
	return plan, x, nil
}

// borrowerName is how explanations name a borrower that is not a ready
// node, which placement puts at the control plane's vertex.
func borrowerName(borrower string) string {
	if borrower == "" {
		return "an unnamed borrower (placed at the control plane)"
	}
	return borrower + " (not a ready node: placed at the control plane)"
}

// placementRequest converts an API request to placement's. Size 0 (block,
// memory, nic) or whole asks for a whole device; a nic request's size is
// its bandwidth (validateNICRequest), with no stripe unit; accel counts slots: an accel
// lease is dedicated (count slots of its own, Exact: never more — a
// one-slot partition in placement's terms) or shared (one slot serving
// the lender's gateway). Affinity terms that name devices become pins,
// terms that name nodes by name are matched by node ID; labels are a
// selector.
func placementRequest(inv store.Inventory, req api.LeaseRequest, pins map[string]api.Device) (placement.Request, error) {
	affinity, err := nodeTerms(inv, req.Affinity, pins, false)
	if err != nil {
		return placement.Request{}, err
	}
	anti, err := nodeTerms(inv, req.AntiAffinity, nil, true)
	if err != nil {
		return placement.Request{}, err
	}
	borrower, name := cpVertex, borrowerName(req.Borrower)
	for _, n := range inv.Nodes {
		if n.ID == req.Borrower && n.State == api.NodeReady {
			borrower, name = n.ID, ""
		}
	}
	count := req.Count
	if count < 1 {
		count = 1
	}
	preq := placement.Request{
		Kind: string(req.Kind), Size: req.Size, Borrower: borrower, BorrowerName: name, Bandwidth: req.Bandwidth,
		Whole:      req.Whole || (req.Size == 0 && req.Kind != api.KindAccel),
		MaxLatency: time.Duration(req.MaxLatencyUs * float64(time.Microsecond)), Work: req.Work,
		Mode: string(req.Mode), AllowShare: req.Mode == "" || req.Mode == api.ModeShared,
		// With no mode given, placement weighs composing block devices
		// against sharing or dedicating one (Fig. 8 of Call et al.,
		// "Disaggregating Non-Volatile Memory for Throughput-Oriented
		// Genomics Workloads").
		AllowCompose: req.Mode == api.ModeComposed || count > 1 || (req.Mode == "" && req.Kind == api.KindBlock),
		Affinity:     affinity, AntiAffinity: anti,
		Labels: req.Labels, Strategy: req.Strategy,
	}
	if req.Kind == api.KindAccel {
		preq.Role = req.Role
		// Slot units (api.SlotUnits a slot): whole slots, or a share of
		// one for a gateway.
		preq.Size = int64(count) * api.SlotUnits
		switch {
		case preq.Whole:
			preq.Size = int64(req.Count) * api.SlotUnits // the least slots (0: any)
			preq.Mode, preq.AllowShare, preq.AllowCompose = "", false, false
		case req.Mode == api.ModeShared:
			preq.Mode, preq.Size, preq.Gateway = placement.ModeShared, shareUnits(req.Share), requestGateway(req)
			if req.Share == 0 {
				preq.Size = shareUnits(api.DefaultShare)
			}
		default:
			// Dedicated slots: a partition of a device (or several),
			// or a device with exactly count slots, never more.
			preq.Mode, preq.AllowShare, preq.Exact = "", true, true
		}
	}
	preq.Devices = append(preq.Devices, sortedKeys(pinKeys(pins))...)
	if req.DeadlineSecond > 0 {
		preq.Deadline = time.Duration(req.DeadlineSecond * float64(time.Second))
	}
	if req.Mode == "" && count > 1 && req.Kind != api.KindAccel {
		preq.Mode = string(api.ModeComposed)
	}
	if preq.Mode == string(api.ModeComposed) && count > 1 && req.Kind != api.KindAccel {
		preq.Width = count
	}
	if preq.AllowCompose && (req.Kind == api.KindBlock || req.Kind == api.KindMemory) {
		// A composed volume uses whole stripes only: parts of a multiple of
		// the stripe unit make it hold the lease's size.
		preq.StripeUnit = req.StripeUnit
		if preq.StripeUnit == 0 {
			preq.StripeUnit = defaultStripeUnit
		}
	}
	return preq, nil
}

// leaseMode is the lease's mode for placement's: an accel lease is
// dedicated (slots of its own, whatever placement's mode: one partition,
// a composition over devices, or a whole device) unless it is shared
// through a gateway.
func leaseMode(req api.LeaseRequest, mode string) api.Mode {
	if req.Kind != api.KindAccel {
		return api.Mode(mode)
	}
	if req.Mode == api.ModeShared {
		return api.ModeShared
	}
	return api.ModeDedicated
}

// accelNote explains an accel plan in the lease's terms.
func accelNote(req api.LeaseRequest, pp placement.Plan) string {
	var n int64
	for _, p := range pp.Parts {
		n += p.Length
	}
	slots := placement.FormatSlots(n, api.SlotUnits)
	switch {
	case req.Mode == api.ModeShared:
		return fmt.Sprintf("accel: shared, %s of a slot that serves the lender's gateway for role %s (and this role config) only; the gateway weighs the lease's work by its share", slots, req.Role)
	case req.Whole:
		return fmt.Sprintf("accel: dedicated, a whole device (%s)", slots)
	}
	return fmt.Sprintf("accel: dedicated, %s of its own on %d device(s) (placement's %s is the slots it takes)", slots, len(pp.Parts), pp.Mode)
}

// requestGateway is the gateway key of a shared accel request ("" for any
// other): a SHA-256 digest of its role and role config, so that placement
// puts its share only on a slot empty or held by leases of the same role
// and config — a slot serves one gateway. The config may be a secret (an
// AES key): only its digest is kept. The lender's own key adds the device
// (internal/agent, gatewayKey).
func requestGateway(req api.LeaseRequest) string {
	if req.Kind != api.KindAccel || req.Mode != api.ModeShared {
		return ""
	}
	h := sha256.New()
	h.Write([]byte("rialto accel gateway\x00"))
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(req.Role)))
	h.Write(n[:])
	h.Write([]byte(req.Role))
	if c := req.RoleConfig; c != nil {
		for _, b := range [][]byte{c.Config, c.Module} {
			binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
			h.Write(n[:])
			h.Write(b)
		}
		binary.LittleEndian.PutUint64(n[:], uint64(c.WasmMemoryPages))
		h.Write(n[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// nicNote explains a nic plan in the lease's terms (docs/nic.md).
func nicNote(inv store.Inventory, pp placement.Plan) string {
	if len(pp.Parts) == 1 {
		p := pp.Parts[0]
		return fmt.Sprintf("nic: %s of lent interface %s; the lender caps the lease there, in both directions, and translates its traffic to the interface's address",
			resource.FormatLinkRate(float64(p.Length)), deviceText(inv, p.DeviceID))
	}
	var total int64
	for _, p := range pp.Parts {
		total += p.Length
	}
	return fmt.Sprintf("nic: a bond of %d lenders, %s each (%s in all): each flow is pinned to one lender, so bandwidth adds over flows, and losing a lender moves only its flows",
		len(pp.Parts), resource.FormatLinkRate(float64(pp.Parts[0].Length)), resource.FormatLinkRate(float64(total)))
}

// placementMode is the mode placement knows a running lease by: an accel
// lease's mode is the lease's (dedicated slots or shared through a
// gateway), so placement's is read from its parts — a whole device is
// dedicated, several devices composed, a part of one device shared.
func placementMode(kind api.Kind, mode api.Mode, parts []api.Part, capacity func(deviceID string) int64) string {
	if kind != api.KindAccel || len(parts) == 0 {
		return string(mode)
	}
	switch {
	case len(parts) > 1:
		return placement.ModeComposed
	case parts[0].Offset == 0 && parts[0].Length == capacity(parts[0].DeviceID):
		return placement.ModeDedicated
	}
	return placement.ModeShared
}

// nodeTerms returns affinity terms as placement matches them: node names
// become node IDs, device pins are left out (they are Request.Devices).
// Names are not unique (another machine may join under a removed node's
// name, or under a live one's, with the bootstrap token): a name means
// its nodes that are not removed (the removed ones if it has no other). A
// name several such nodes have means them all as an anti-affinity term
// (anti), which keeps every one out; as an affinity term it is ambiguous
// (ErrConflict, the IDs listed), not whichever came first, which could be
// a newcomer's node handed the tenant's bytes meant for another.
func nodeTerms(inv store.Inventory, terms []string, pins map[string]api.Device, anti bool) ([]string, error) {
	if len(terms) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(terms))
	for _, t := range terms {
		if _, ok := pins[t]; ok {
			continue
		}
		var named, kept []api.Node
		byID := false
		for _, n := range inv.Nodes {
			if n.ID == t {
				byID = true
				break
			}
			if n.Name == t {
				named = append(named, n)
				if n.State != api.NodeRemoved {
					kept = append(kept, n)
				}
			}
		}
		if len(kept) == 0 {
			kept = named
		}
		switch {
		case byID || len(kept) == 0:
			out = append(out, t)
		case len(kept) == 1 || anti:
			for _, n := range kept {
				out = append(out, n.ID)
			}
		default:
			alts := make([]string, len(kept))
			for i, n := range kept {
				alts[i] = fmt.Sprintf("%s (%s)", n.ID, n.State)
			}
			return nil, fmt.Errorf("%w: affinity term %s is ambiguous: nodes %s have that name; give the node's ID", ErrConflict, t, strings.Join(alts, ", "))
		}
	}
	return out, nil
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

func pinKeys(pins map[string]api.Device) map[string]string {
	m := make(map[string]string, len(pins))
	for k := range pins {
		m[k] = k
	}
	return m
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// infeasiblePlan turns placement's error into a plan and the control
// plane's error: which constraint, and each candidate's rejection (for a
// pinned request, each pinned device's).
func infeasiblePlan(inv store.Inventory, pins map[string]api.Device, head []string, now time.Time, err error) (api.Plan, error) {
	plan := api.Plan{At: now, State: "infeasible", Explanation: head}
	var ie *placement.InfeasibleError
	switch {
	case errors.As(err, &ie):
		plan.Explanation = append(plan.Explanation, "placement: infeasible ("+ie.Constraint+"): "+ie.Detail)
		var why, quota []string
		for _, r := range ie.Rejections {
			if r.Constraint == placement.ConstraintQuota && len(quota) == 0 {
				quota = append(quota, r.Reason)
			}
			plan.Explanation = append(plan.Explanation, "  "+rejectionText(r))
			if _, ok := pins[r.Candidate]; ok {
				why = append(why, fmt.Sprintf("pinned device %s: %s", r.Text(), r.Reason))
			}
		}
		if ie.Omitted > 0 {
			plan.Explanation = append(plan.Explanation, fmt.Sprintf("  … %d more", ie.Omitted))
		}
		if ie.Constraint == placement.ConstraintQuota {
			if len(quota) == 0 {
				quota = append(quota, ie.Detail)
			}
			return plan, fmt.Errorf("%w: %s; release some leases first", ErrQuota, quota[0])
		}
		if len(why) > 0 {
			return plan, fmt.Errorf("%w: %s", ErrInfeasible, strings.Join(why, "; "))
		}
		return plan, fmt.Errorf("%w: %v", ErrInfeasible, err)
	case errors.Is(err, placement.ErrInvalid):
		plan.Explanation = append(plan.Explanation, err.Error())
		return plan, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return plan, err
}

// rejectionText is a rejection as an explanation's line: the candidate,
// the constraint and the reason, the constraint left out when the reason
// starts with its word ("n3/disk0 (dev-…): node n3 (node-…) is skipped
// (…)", "n1/disk1 (dev-…): exclusive (lent whole only): …", not "node:
// node n3", "exclusive: exclusive").
func rejectionText(r placement.Rejection) string {
	if strings.HasPrefix(r.Reason, r.Constraint+" ") {
		return r.Text() + ": " + r.Reason
	}
	return r.Text() + ": " + r.Constraint + ": " + r.Reason
}

// snapshot converts the inventory to placement's model, with the tenants'
// quotas. Skipped nodes are excluded ("skipped (it did not confirm the
// part)"; their whys are the plan's head and the reason's): they lend nothing
// to the request, though a skipped node that borrows still does.
func snapshot(inv store.Inventory, skip map[string]string, now time.Time, q Quotas) *placement.Snapshot {
	s := &placement.Snapshot{Now: time.Duration(now.UnixNano()), Nodes: []placement.Node{{ID: cpVertex, State: placement.NodeReady}},
		Quotas: q.Tenants, DefaultQuota: q.Default, SlotUnits: api.SlotUnits}
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
		pn := placement.Node{ID: n.ID, Name: n.Name, State: string(n.State), Labels: n.Labels, Cordoned: n.Cordoned}
		switch why := skip[n.ID]; why {
		case "":
		case skipPartLender:
			pn.Excluded = "skipped (it is the part's lender, which the part moves away from)"
		default:
			// Why is the failed lease's reason's (lenders did not
			// confirm (…)): the rejection says it once.
			pn.Excluded = "skipped (it did not confirm the part)"
		}
		s.Nodes = append(s.Nodes, pn)
		if !hasLink[n.ID] {
			s.Links = append(s.Links, fabric.Link{ID: n.ID + ">lan", A: n.ID, B: lanVertex, Kind: fabric.Ethernet})
		}
	}
	for _, d := range inv.Devices {
		st := ""
		if d.State != "available" {
			st = d.State
		}
		s.Devices = append(s.Devices, placement.Device{ID: d.ID, Name: d.Name, Node: d.NodeID, Kind: string(d.Kind), Model: d.Model, Capacity: d.Capacity, State: st,
			Exclusive: d.Sharing == "exclusive", Roles: deviceRoles(d)})
	}
	byLease := map[string]int{}
	for _, p := range inv.Parts {
		i, ok := byLease[p.LeaseID]
		if !ok {
			i = len(s.Leases)
			byLease[p.LeaseID] = i
			l := placement.Lease{ID: p.LeaseID, Tenant: p.Tenant, Borrower: cpVertex, Mode: string(p.Mode),
				Demand: p.Demand.Bandwidth, Remaining: p.Demand.Work, Gateway: p.Demand.Gateway}
			if !p.Demand.Deadline.IsZero() {
				l.Deadline = time.Duration(p.Demand.Deadline.UnixNano())
			}
			s.Leases = append(s.Leases, l)
		}
		s.Leases[i].Parts = append(s.Leases[i].Parts, placement.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
	}
	kind := make(map[string]string, len(inv.Devices))
	capa := make(map[string]int64, len(inv.Devices))
	for _, d := range inv.Devices {
		kind[d.ID], capa[d.ID] = string(d.Kind), d.Capacity
	}
	for i := range s.Leases {
		l := &s.Leases[i]
		l.Kind = kind[l.Parts[0].DeviceID]
		if l.Kind == placement.KindAccel {
			parts := make([]api.Part, len(l.Parts))
			for j, p := range l.Parts {
				parts[j] = api.Part{DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length}
			}
			l.Mode = placementMode(api.KindAccel, api.Mode(l.Mode), parts, func(id string) int64 { return capa[id] })
		}
	}
	return s
}

// nodeText is how explanations name node id, as placement's do: "node
// n2 (node-…)", or "node <id>" when it has no name.
func nodeText(inv store.Inventory, id string) string {
	for _, n := range inv.Nodes {
		if n.ID == id && n.Name != "" && n.Name != id {
			return "node " + n.Name + " (" + id + ")"
		}
	}
	return "node " + id
}

// deviceText is how explanations name device id, as placement's do:
// "n2/disk0 (dev-…)" (its node's name, its name, its ID), or the ID when
// it has no name.
func deviceText(inv store.Inventory, id string) string {
	for _, d := range inv.Devices {
		if d.ID != id || d.Name == "" || d.Name == id {
			continue
		}
		node := d.NodeID
		for _, n := range inv.Nodes {
			if n.ID == d.NodeID && n.Name != "" {
				node = n.Name
			}
		}
		return node + "/" + d.Name + " (" + id + ")"
	}
	return id
}

// deviceRoles are the roles an accel device offers, from the list its
// agent registers (attributes.roles, comma-separated); nil when it
// registers none (an older agent, a declared device): placement then lets
// any role through to it.
func deviceRoles(d api.Device) []string {
	v, ok := d.Attributes["roles"]
	if d.Kind != api.KindAccel || !ok {
		return nil
	}
	roles := []string{}
	for _, r := range strings.Split(v, ",") {
		if r = strings.TrimSpace(r); r != "" {
			roles = append(roles, r)
		}
	}
	return roles
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

// otherLease stands for another tenant's lease in a plan's texts.
const otherLease = "(another tenant's lease)"

// hideOtherLeases takes the IDs of other tenants' leases out of a tenant's
// plan and placement error (placement names the running leases a plan
// would slow or make miss their deadline): GET /v1/leases/{id} does not
// reveal them either. Their impacts stay, without an ID.
func hideOtherLeases(owner func(id string) (string, bool), tenant string, plan api.Plan, err error) (api.Plan, error) {
	named := map[string]bool{}
	for _, im := range plan.Impacts {
		named[im.LeaseID] = true
	}
	for _, s := range plan.Explanation {
		leaseIDs(s, named)
	}
	if err != nil {
		leaseIDs(err.Error(), named)
	}
	if len(named) == 0 {
		return plan, err
	}
	var pairs []string
	for id := range named {
		if t, ok := owner(id); ok && t != tenant {
			pairs = append(pairs, id, otherLease)
		}
	}
	if len(pairs) == 0 {
		return plan, err
	}
	r := strings.NewReplacer(pairs...)
	impacts := make([]api.Impact, len(plan.Impacts))
	for i, im := range plan.Impacts {
		if r.Replace(im.LeaseID) != im.LeaseID {
			im.LeaseID = ""
		}
		impacts[i] = im
	}
	plan.Impacts = impacts
	expl := make([]string, len(plan.Explanation))
	for i, s := range plan.Explanation {
		expl[i] = r.Replace(s)
	}
	plan.Explanation = expl
	if err != nil {
		if msg := r.Replace(err.Error()); msg != err.Error() {
			err = hiddenError{err, msg}
		}
	}
	return plan, err
}

// leaseIDs adds the lease IDs ("lease-" and its random part) s names to
// ids.
func leaseIDs(s string, ids map[string]bool) {
	for {
		i := strings.Index(s, "lease-")
		if i < 0 {
			return
		}
		j := i + len("lease-")
		for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] >= 'a' && s[j] <= 'z') {
			j++
		}
		ids[s[i:j]] = true
		s = s[j:]
	}
}

// hiddenError is an error with another message: errors.Is still finds
// what it wraps.
type hiddenError struct {
	err error
	msg string
}

func (e hiddenError) Error() string { return e.msg }
func (e hiddenError) Unwrap() error { return e.err }
