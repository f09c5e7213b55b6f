package controlplane

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/placement"
)

// reserver is the one owner of placement's view of the inventory: the
// nodes, devices, links, profiles and live lease parts it places against,
// placement's index over them, and the lock that serializes placements.
// It is the plan half of the reservation pipeline (plan → apply): Place
// chooses a lease's parts and holds them in the view, so that concurrent
// requests place around them; the caller then writes the reservation, and
// reports the write's outcome with Commit (written) or Release (refused,
// or the lease ended). The store re-checks every part when it writes, so
// a stale view costs a retry (Invalidate, then Place again), never an
// over-commit: the view is a cache, the store the authority.
//
// The view is loaded from the store on first use and after Invalidate
// (a join, a liveness change, a stored profile, a lost race for a device);
// between loads, live parts are kept up to date incrementally. Parts that
// were placed but whose write is in flight (held) survive a reload, so a
// reload never lets a concurrent request place on them.
//
// Build it with newReserver. Its methods are safe for concurrent use.
type reserver struct {
	st store.Store
	// shared: other replicas write the store too, so a refusal on the
	// view (no capacity, over quota) may be stale: the view is reloaded
	// and the request placed once more before it is refused.
	shared bool
	// seed picks this replica's share of the nodes (shared stores): a
	// new lease is placed on the share first, so that replicas placing
	// from similar views seldom choose the same range (each choice they
	// share is a lost race and a retry).
	seed  uint64
	share []string // node IDs, from the view

	// cur is quotas, for readers that must not wait for a placement
	// (the store's re-check of a creation: Server.limit).
	cur atomic.Pointer[Quotas]

	mu       sync.Mutex // serializes placements; guards the fields below
	quotas   Quotas
	valid    bool
	nodes    []api.Node
	devices  []api.Device
	links    []api.Link
	profiles []api.Profile
	parts    map[string][]store.LivePart // live parts by lease ID
	devName  map[string]string

	// held are the parts placed here whose write is in flight, by lease
	// ID: a reload keeps them in the view until Commit or Release.
	held map[string][]store.LivePart

	// idx is placement's index over the view, built on the first
	// placement after a load and kept up to date as parts are held and
	// released (Index.Add and Index.Remove), so that a lease request does
	// not rebuild it. It is used only while no live lease carries work
	// or a deadline (timed): the index's clock would then move their
	// remaining work, which a rebuilt snapshot does not.
	idx   *placement.Index
	timed map[string]bool // lease IDs with work or a deadline

	// wiping are the block ranges being wiped, by lease ID and node ID
	// (wiping.go): in the view (under wipeKey) once their lease left it.
	wiping map[string]map[string][]store.LivePart
	// wipeDone is closed when a range being wiped is confirmed wiped.
	wipeDone chan struct{}
}

// maxShare bounds a replica's share of the nodes (reserver.share).
const maxShare = 8

// hold names the lease a placement is for: the view records its parts
// under id, for tenant, with the request's demand.
type hold struct {
	id     string
	tenant string
	kind   api.Kind
	demand store.Demand
}

func newReserver(st store.Store, quotas Quotas) *reserver {
	r := &reserver{st: st, quotas: quotas}
	r.cur.Store(&quotas)
	return r
}

// Place places req for the lease h names, avoiding the nodes in skip
// (node ID → why), and holds the plan's parts in the view under h.id
// until Commit or Release. A lease already in the view (a re-placement)
// is placed as if it held nothing: it neither holds its old parts, which
// its new ones replace, nor counts against its tenant's quota.
func (r *reserver) Place(ctx context.Context, h hold, req api.LeaseRequest, skip map[string]string, now time.Time) (api.Plan, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fresh := !r.valid
	if err := r.load(ctx); err != nil {
		return api.Plan{}, err
	}
	plan, err := r.place(h, req, skip, now)
	if err != nil && r.shared && !fresh && (errors.Is(err, ErrInfeasible) || errors.Is(err, ErrQuota)) {
		r.valid = false
		if err := r.load(ctx); err != nil {
			return api.Plan{}, err
		}
		plan, err = r.place(h, req, skip, now)
	}
	if err != nil {
		return plan, err
	}
	plan.ID = h.id
	ps := make([]store.LivePart, len(plan.Parts))
	for i, p := range plan.Parts {
		ps[i] = store.LivePart{Part: p, LeaseID: h.id, Mode: plan.Mode, Tenant: h.tenant, Demand: h.demand}
	}
	if r.held == nil {
		r.held = map[string][]store.LivePart{}
	}
	r.held[h.id] = ps
	r.enter(h.id, h.kind, ps)
	return plan, nil
}

// place places with the cached index when it can: a new lease whose
// request needs no more of the view than its nodes (no skipped nodes, no
// device pins). Otherwise, and to explain a refusal, it builds the whole
// view (every live part, every device's allocation). r.mu is held.
func (r *reserver) place(h hold, req api.LeaseRequest, skip map[string]string, now time.Time) (api.Plan, error) {
	_, replacing := r.parts[h.id]
	if !replacing && len(skip) == 0 && len(req.Affinity) == 0 && len(r.share) > 0 {
		if x := r.index(store.Inventory{}, now); x != nil {
			nodes := store.Inventory{Nodes: r.nodes, Links: r.links, Profiles: r.profiles}
			mine := req
			mine.Affinity = r.share
			plan, err := policyPlace(nodes, mine, h.tenant, r.quotas, nil, now, func(store.Inventory, time.Time) *placement.Index { return x })
			if err == nil {
				// The share is this replica's, not the request's: its
				// rejections are not the request's either.
				ex := plan.Explanation[:0:0]
				for _, e := range plan.Explanation {
					if !strings.HasSuffix(e, " fails affinity") {
						ex = append(ex, e)
					}
				}
				plan.Explanation = append(ex, fmt.Sprintf("replicas: placed on this control-plane replica's share of the nodes (%d of %d), so that replicas seldom choose the same range", len(r.share), len(r.nodes)))
				return plan, nil
			}
		}
	}
	if !replacing && len(skip) == 0 && len(req.Affinity) == 0 {
		if x := r.index(store.Inventory{}, now); x != nil {
			nodes := store.Inventory{Nodes: r.nodes, Links: r.links, Profiles: r.profiles}
			plan, err := policyPlace(nodes, req, h.tenant, r.quotas, nil, now, func(store.Inventory, time.Time) *placement.Index { return x })
			if err == nil {
				return plan, nil
			}
		}
	}
	inv := r.view()
	if replacing {
		return policyPlace(withoutLease(inv, h.id), req, h.tenant, r.quotas, skip, now, nil)
	}
	return policyPlace(inv, req, h.tenant, r.quotas, skip, now, r.index)
}

// Preview places req for tenant without holding anything (a dry run). It
// places outside the lock, on a copy of the view.
func (r *reserver) Preview(ctx context.Context, req api.LeaseRequest, tenant string, now time.Time) (api.Plan, error) {
	r.mu.Lock()
	err := r.load(ctx)
	var inv store.Inventory
	if err == nil {
		inv = r.view()
	}
	quotas := r.quotas
	r.mu.Unlock()
	if err != nil {
		return api.Plan{}, err
	}
	return policyPlace(inv, req, tenant, quotas, nil, now, nil)
}

// Commit records that the write of lease id's held parts committed: they
// are the lease's live parts now, in the view as in the store.
func (r *reserver) Commit(id string) {
	r.mu.Lock()
	delete(r.held, id)
	r.mu.Unlock()
}

// Release takes lease id's parts out of the view: its write was refused,
// or the lease ended.
func (r *reserver) Release(id string) {
	r.mu.Lock()
	delete(r.held, id)
	if r.valid {
		if _, ok := r.parts[id]; ok && r.idx != nil {
			if err := r.idx.Remove(id); err != nil {
				r.idx = nil
			}
		}
		delete(r.parts, id)
		delete(r.timed, id)
		r.enterWipes(id) // its ranges being wiped stay
	}
	r.mu.Unlock()
}

// SetQuotas replaces the quotas placement enforces from the next
// placement on; the leases in the view keep their parts.
func (r *reserver) SetQuotas(q Quotas) {
	r.mu.Lock()
	r.quotas = q
	r.cur.Store(&q)
	r.idx = nil // it was built with the old quotas
	r.mu.Unlock()
}

// Quotas are the quotas placement enforces (New's, or the last
// SetQuotas's), read without waiting for a placement.
func (r *reserver) Quotas() Quotas {
	if q := r.cur.Load(); q != nil {
		return *q
	}
	return Quotas{}
}

// Invalidate makes the next placement reload the view from the store.
func (r *reserver) Invalidate() {
	r.mu.Lock()
	r.valid = false
	r.mu.Unlock()
}

// DeviceNames returns device names by ID (nil if the view cannot be
// loaded). The map is not changed afterwards: a reload replaces it.
func (r *reserver) DeviceNames(ctx context.Context) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.load(ctx); err != nil {
		return nil
	}
	return r.devName
}

// load (re)loads the view when it is not valid, keeping the held parts.
// r.mu is held.
func (r *reserver) load(ctx context.Context) error {
	if r.valid {
		return nil
	}
	inv, err := r.st.Inventory(ctx)
	if err != nil {
		return err
	}
	r.nodes, r.devices, r.links, r.profiles = inv.Nodes, inv.Devices, inv.Links, inv.Profiles
	r.parts = map[string][]store.LivePart{}
	r.timed = map[string]bool{}
	r.idx = nil
	for _, p := range inv.Parts {
		r.parts[p.LeaseID] = append(r.parts[p.LeaseID], p)
		if timedDemand(p.Demand) {
			r.timed[p.LeaseID] = true
		}
	}
	if w, ok := r.st.(store.Wiper); ok && r.shared {
		if err := r.loadWipes(ctx, w); err != nil {
			return err
		}
	}
	for id, ps := range r.held {
		r.parts[id] = ps
		delete(r.timed, id)
		if len(ps) > 0 && timedDemand(ps[0].Demand) {
			r.timed[id] = true
		}
	}
	for id, m := range r.wiping {
		if _, live := r.parts[id]; live {
			continue // its parts hold the ranges
		}
		for n, ps := range m {
			r.parts[wipeKey(id, n)] = ps
		}
	}
	r.share = nil
	if r.shared && len(inv.Nodes) > 1 {
		// Half the nodes, at most maxShare (the affinity terms cost a
		// pass over the nodes each), ranked by a hash of this replica's.
		type ranked struct {
			id string
			h  uint64
		}
		rs := make([]ranked, len(inv.Nodes))
		for i, n := range inv.Nodes {
			h := fnv.New64a()
			h.Write([]byte(n.ID))
			rs[i] = ranked{n.ID, h.Sum64() ^ r.seed}
		}
		sort.Slice(rs, func(i, j int) bool { return rs[i].h < rs[j].h })
		for _, x := range rs[:min(maxShare, len(rs)/2)] {
			r.share = append(r.share, x.id)
		}
	}
	r.devName = make(map[string]string, len(inv.Devices))
	for _, d := range inv.Devices {
		r.devName[d.ID] = d.Name
	}
	r.valid = true
	return nil
}

// view is the whole placement view: every live part, and each device's
// allocation from them. r.mu is held and the view loaded.
func (r *reserver) view() store.Inventory {
	inv := store.Inventory{Nodes: r.nodes, Links: r.links, Profiles: r.profiles}
	alloc := map[string]int64{}
	for _, ps := range r.parts {
		for _, p := range ps {
			inv.Parts = append(inv.Parts, p)
			alloc[p.DeviceID] += p.Length
		}
	}
	inv.Devices = make([]api.Device, len(r.devices))
	for i, d := range r.devices {
		d.Allocated = alloc[d.ID]
		inv.Devices[i] = d
	}
	return inv
}

// enter records a lease's parts in the view and the index (replacing the
// lease's previous parts). r.mu is held and the view loaded.
func (r *reserver) enter(id string, kind api.Kind, ps []store.LivePart) {
	r.parts[id] = ps
	delete(r.timed, id)
	if len(ps) == 0 {
		return
	}
	d := ps[0].Demand
	if timedDemand(d) {
		r.timed[id] = true
	}
	if x := r.idx; x != nil {
		_ = x.Remove(id) // a re-placement replaces the lease's parts
		parts := make([]api.Part, len(ps))
		for i, p := range ps {
			parts[i] = p.Part
		}
		pl := placement.Lease{ID: id, Tenant: ps[0].Tenant, Borrower: cpVertex, Mode: placementMode(kind, ps[0].Mode, parts, r.capacity), Kind: string(kind),
			Demand: d.Bandwidth, Remaining: d.Work, Gateway: d.Gateway}
		if !d.Deadline.IsZero() {
			pl.Deadline = time.Duration(d.Deadline.UnixNano())
		}
		for _, p := range parts {
			pl.Parts = append(pl.Parts, placement.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
		}
		if err := x.Add(pl); err != nil {
			r.idx = nil // rebuilt from the view by the next placement
		}
	}
}

// capacity is a device's capacity in the view. r.mu is held.
func (r *reserver) capacity(deviceID string) int64 {
	for _, d := range r.devices {
		if d.ID == deviceID {
			return d.Capacity
		}
	}
	return 0
}

// kind is a device's kind in the view (block for one it does not hold).
// r.mu is held.
func (r *reserver) kind(deviceID string) api.Kind {
	for _, d := range r.devices {
		if d.ID == deviceID {
			return d.Kind
		}
	}
	return api.KindBlock
}

// index is the indexSource over the view: the cached index, advanced to
// now, or nil when the view has timed leases or the clock went back (the
// caller then builds one for its request). inv must be the whole view
// (view), or empty to probe for an index already built. r.mu is held.
func (r *reserver) index(inv store.Inventory, now time.Time) *placement.Index {
	if !r.valid || len(r.timed) > 0 {
		return nil
	}
	at := time.Duration(now.UnixNano())
	if r.idx != nil && at < r.idx.Now() {
		return nil // the clock went back: build one for this request
	}
	if r.idx == nil {
		if inv.Devices == nil && inv.Nodes == nil {
			return nil // a probe: no view to build one from
		}
		r.idx = placement.NewIndex(snapshot(inv, nil, now, r.quotas))
	}
	r.idx.Advance(at)
	return r.idx
}

// timedDemand reports whether a lease's demand has work or a deadline.
func timedDemand(d store.Demand) bool { return d.Work > 0 || !d.Deadline.IsZero() }
