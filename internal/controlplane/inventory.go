package controlplane

import (
	"context"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/placement"
)

// invCache is the placement view of the inventory, kept in memory so that
// a lease request does not re-read every node and device. It is guarded by
// Server.placeMu. Live parts are maintained incrementally (added when a
// reservation commits, removed when a lease ends); nodes, devices and
// links are reloaded after a join, a liveness change, a lost reservation
// race, a stored profile, and at every Sweep. Staleness is safe: the store re-checks every
// reservation atomically, and a refused one invalidates the cache.
type invCache struct {
	valid    bool
	nodes    []api.Node
	devices  []api.Device
	links    []api.Link
	profiles []api.Profile
	parts    map[string][]store.LivePart // by lease ID
	devName  map[string]string

	// idx is placement's index over the cached inventory, built on the
	// first request after a reload and kept up to date by cacheLease and
	// uncacheLease (Index.Add and Index.Remove), so that a lease request
	// does not rebuild it. It is used only while no live lease carries
	// work or a deadline (timed): the index's clock would then move
	// their remaining work, which a rebuilt snapshot does not.
	idx   *placement.Index
	timed map[string]bool // lease IDs with work or a deadline
}

// inventory returns the placement view; placeMu must be held.
func (s *Server) inventory(ctx context.Context) (store.Inventory, error) {
	if err := s.loadInventory(ctx); err != nil {
		return store.Inventory{}, err
	}
	c := &s.inv
	inv := store.Inventory{Nodes: c.nodes, Links: c.links, Profiles: c.profiles}
	alloc := map[string]int64{}
	for _, ps := range c.parts {
		for _, p := range ps {
			inv.Parts = append(inv.Parts, p)
			alloc[p.DeviceID] += p.Length
		}
	}
	inv.Devices = make([]api.Device, len(c.devices))
	for i, d := range c.devices {
		d.Allocated = alloc[d.ID]
		inv.Devices[i] = d
	}
	return inv, nil
}

// placeNew places a new lease's request: with the cached index when it
// has one and the request needs no more of the inventory than its nodes
// (no skipped nodes, no device pins), without building the whole view
// (every live part and every device's allocation) that inventory returns;
// else, and to explain a refusal, as placeLocked does. placeMu must be
// held.
func (s *Server) placeNew(ctx context.Context, req api.LeaseRequest, tenant string, skip map[string]string, now time.Time) (api.Plan, error) {
	if err := s.loadInventory(ctx); err != nil {
		return api.Plan{}, err
	}
	if len(skip) == 0 && len(req.Affinity) == 0 {
		if x := s.placeIndex(store.Inventory{}, now); x != nil {
			c := &s.inv
			nodes := store.Inventory{Nodes: c.nodes, Links: c.links, Profiles: c.profiles}
			plan, err := policyPlace(nodes, req, tenant, s.cfg.Quotas, nil, now, func(store.Inventory, time.Time) *placement.Index { return x })
			if err == nil {
				return plan, nil
			}
		}
	}
	inv, err := s.inventory(ctx)
	if err != nil {
		return api.Plan{}, err
	}
	return s.placeLocked(inv, req, tenant, skip, now)
}

// loadInventory (re)loads the cache when it is not valid; placeMu must be
// held.
func (s *Server) loadInventory(ctx context.Context) error {
	c := &s.inv
	if !c.valid {
		inv, err := s.st.Inventory(ctx)
		if err != nil {
			return err
		}
		c.nodes, c.devices, c.links, c.profiles = inv.Nodes, inv.Devices, inv.Links, inv.Profiles
		c.parts = map[string][]store.LivePart{}
		c.timed = map[string]bool{}
		c.idx = nil
		for _, p := range inv.Parts {
			c.parts[p.LeaseID] = append(c.parts[p.LeaseID], p)
			if timedDemand(p.Demand) {
				c.timed[p.LeaseID] = true
			}
		}
		c.devName = make(map[string]string, len(inv.Devices))
		for _, d := range inv.Devices {
			c.devName[d.ID] = d.Name
		}
		c.valid = true
	}
	return nil
}

// cacheLease records a committed reservation; placeMu must be held.
func (s *Server) cacheLease(l api.Lease, d store.Demand) {
	if !s.inv.valid {
		return
	}
	ps := make([]store.LivePart, len(l.Parts))
	for i, p := range l.Parts {
		ps[i] = store.LivePart{Part: p, LeaseID: l.ID, Mode: l.Mode, Tenant: l.Tenant, Demand: d}
	}
	s.inv.parts[l.ID] = ps
	delete(s.inv.timed, l.ID)
	if timedDemand(d) {
		s.inv.timed[l.ID] = true
	}
	if x := s.inv.idx; x != nil {
		_ = x.Remove(l.ID) // a re-placement replaces the lease's parts
		pl := placement.Lease{ID: l.ID, Tenant: l.Tenant, Borrower: cpVertex, Mode: placementMode(l.Kind, l.Mode, l.Parts, s.capacity), Kind: string(l.Kind),
			Demand: d.Bandwidth, Remaining: d.Work}
		if !d.Deadline.IsZero() {
			pl.Deadline = time.Duration(d.Deadline.UnixNano())
		}
		for _, p := range l.Parts {
			pl.Parts = append(pl.Parts, placement.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
		}
		if err := x.Add(pl); err != nil {
			s.inv.idx = nil // rebuilt from the cache on the next request
		}
	}
}

// capacity is a cached device's capacity; placeMu must be held.
func (s *Server) capacity(deviceID string) int64 {
	for _, d := range s.inv.devices {
		if d.ID == deviceID {
			return d.Capacity
		}
	}
	return 0
}

// uncacheLease forgets a lease that ended.
func (s *Server) uncacheLease(id string) {
	s.placeMu.Lock()
	if s.inv.valid {
		if _, ok := s.inv.parts[id]; ok && s.inv.idx != nil {
			if err := s.inv.idx.Remove(id); err != nil {
				s.inv.idx = nil
			}
		}
		delete(s.inv.parts, id)
		delete(s.inv.timed, id)
	}
	s.placeMu.Unlock()
}

// timedDemand reports whether a lease's demand has work or a deadline.
func timedDemand(d store.Demand) bool { return d.Work > 0 || !d.Deadline.IsZero() }

// placeIndex is the indexSource over the cache; placeMu must be held and
// inv must come from inventory.
func (s *Server) placeIndex(inv store.Inventory, now time.Time) *placement.Index {
	c := &s.inv
	if !c.valid || len(c.timed) > 0 {
		return nil
	}
	at := time.Duration(now.UnixNano())
	if c.idx != nil && at < c.idx.Now() {
		return nil // the clock went back: build one for this request
	}
	if c.idx == nil {
		if inv.Devices == nil && inv.Nodes == nil {
			return nil // placeNew's probe: no view to build one from
		}
		c.idx = placement.NewIndex(snapshot(inv, nil, now, s.cfg.Quotas))
	}
	c.idx.Advance(at)
	return c.idx
}

// invalidate makes the next placement reload the inventory, and the next
// lender call re-read its node.
func (s *Server) invalidate() {
	s.placeMu.Lock()
	s.inv.valid = false
	s.placeMu.Unlock()
	s.nodes.mu.Lock()
	s.nodes.gen++
	s.nodes.m = nil
	s.nodes.mu.Unlock()
}

// nodeCache keeps the node records lender calls need (address, agent key,
// state), so that a lease cycle does not read and decode its lenders'
// rows every time. It is dropped by invalidate, which every join, rejoin
// and liveness change calls.
type nodeCache struct {
	mu  sync.Mutex
	gen uint64
	m   map[string]store.NodeRecord
}

// nodeRecord returns a node's record, from the cache when it has it.
func (s *Server) nodeRecord(ctx context.Context, id string) (store.NodeRecord, error) {
	c := &s.nodes
	c.mu.Lock()
	n, ok := c.m[id]
	gen := c.gen
	c.mu.Unlock()
	if ok {
		return n, nil
	}
	n, err := s.st.Node(ctx, id)
	if err != nil {
		return n, err
	}
	c.mu.Lock()
	if c.gen == gen {
		if c.m == nil {
			c.m = map[string]store.NodeRecord{}
		}
		c.m[id] = n
	}
	c.mu.Unlock()
	return n, nil
}

// deviceNames returns device names by ID for the given parts.
func (s *Server) deviceNames(ctx context.Context) map[string]string {
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	if err := s.loadInventory(ctx); err != nil {
		return nil
	}
	return s.inv.devName
}
