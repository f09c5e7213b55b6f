package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// This file keeps block ranges whose wipe the control plane has not seen
// confirmed out of placement (docs/placement.md, "Ranges being wiped").
//
// A lender wipes a block lease's ranges when it tears the lease down, and
// refuses to lend them again until the zeroes are durable. The control
// plane marks the ranges being wiped when it tells the lenders to tear a
// block lease down (reserver.Wiping); once the lease has ended and its
// parts left the view (reserver.Release), the marked ranges stay in the
// view, held by no tenant, so that placement does not choose them. A
// mark goes (reserver.Wiped) when the lender answers the teardown (it
// answers once its wipes are done), or when a heartbeat of the lender no
// longer lists the lease as served or being wiped (api.Heartbeat.Wiping).

// wipeKey is the view's lease ID for the ranges of lease id on node
// being wiped.
func wipeKey(id, node string) string { return wipePrefix + id + ":" + node }

// wipePrefix begins the view's lease IDs of ranges being wiped.
const wipePrefix = "wiping:"

// Wiping marks lease id's block parts (but the lost ones, and those on
// node except) as being wiped, until Wiped. Parts of other kinds are not
// wiped: they are not marked.
func (r *reserver) Wiping(l api.Lease, except string) {
	if l.Kind != api.KindBlock {
		return
	}
	byNode := map[string][]store.LivePart{}
	for _, p := range l.Parts {
		if p.Lost() || p.NodeID == except || p.Length <= 0 {
			continue
		}
		byNode[p.NodeID] = append(byNode[p.NodeID], store.LivePart{Part: p, LeaseID: wipeKey(l.ID, p.NodeID), Mode: l.Mode})
	}
	if len(byNode) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wiping == nil {
		r.wiping = map[string]map[string][]store.LivePart{}
	}
	m := r.wiping[l.ID]
	if m == nil {
		m = map[string][]store.LivePart{}
		r.wiping[l.ID] = m
	}
	for n, ps := range byNode {
		m[n] = ps
	}
	if _, live := r.parts[l.ID]; r.valid && !live {
		r.enterWipes(l.ID) // the lease left the view already
	}
}

// enterWipes enters lease id's ranges being wiped in the view, which no
// longer holds the lease's parts. r.mu is held and the view loaded.
func (r *reserver) enterWipes(id string) {
	for n, ps := range r.wiping[id] {
		k := wipeKey(id, n)
		if _, ok := r.parts[k]; !ok {
			r.enter(k, api.KindBlock, ps)
		}
	}
}

// Wiped drops the marks of lease id's ranges on node: the lender
// confirmed their wipe (or has nothing of the lease to wipe).
func (r *reserver) Wiped(id, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wipedLocked(id, node)
}

// wipedLocked is Wiped; r.mu is held.
func (r *reserver) wipedLocked(id, node string) {
	m, ok := r.wiping[id]
	if !ok {
		return
	}
	if _, ok := m[node]; !ok {
		return
	}
	delete(m, node)
	if len(m) == 0 {
		delete(r.wiping, id)
	}
	if k := wipeKey(id, node); r.valid {
		if _, ok := r.parts[k]; ok {
			if r.idx != nil {
				if err := r.idx.Remove(k); err != nil {
					r.idx = nil
				}
			}
			delete(r.parts, k)
			delete(r.timed, k)
		}
	}
	if r.wipeDone != nil {
		close(r.wipeDone)
		r.wipeDone = nil
	}
}

// WipedOn drops the marks on node of the leases for which busy is false:
// a heartbeat of the node lists them neither as served nor as being
// wiped.
func (r *reserver) WipedOn(node string, busy func(id string) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var done []string
	for id, m := range r.wiping {
		if _, ok := m[node]; ok && !busy(id) {
			done = append(done, id)
		}
	}
	for _, id := range done {
		r.wipedLocked(id, node)
	}
}

// marked reports whether lease id's ranges on node are marked as being
// wiped.
func (r *reserver) marked(id, node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.wiping[id][node]
	return ok
}

// roomAfterWipes reports whether req would find room for h (avoiding
// skip) once the ranges being wiped are wiped: whether waiting for them
// is worth it.
func (r *reserver) roomAfterWipes(ctx context.Context, h hold, req api.LeaseRequest, skip map[string]string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.load(ctx); err != nil {
		return false
	}
	inv := r.view()
	n := len(inv.Parts)
	inv.Parts = slices.DeleteFunc(inv.Parts, func(p store.LivePart) bool {
		return strings.HasPrefix(p.LeaseID, wipePrefix) || p.LeaseID == h.id
	})
	if len(inv.Parts) == n {
		return false // nothing being wiped
	}
	alloc := map[string]int64{}
	for _, p := range inv.Parts {
		alloc[p.DeviceID] += p.Length
	}
	for i := range inv.Devices {
		inv.Devices[i].Allocated = alloc[inv.Devices[i].ID]
	}
	_, err := policyPlace(inv, req, h.tenant, r.quotas, skip, now, nil)
	return err == nil
}

// wipesPending returns whether ranges are marked as being wiped and, if
// so, a channel closed when a mark goes.
func (r *reserver) wipesPending() (<-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.wiping) == 0 {
		return nil, false
	}
	if r.wipeDone == nil {
		r.wipeDone = make(chan struct{})
	}
	return r.wipeDone, true
}

// refusedWiping marks a range lender node refused to lease id because it
// is being wiped (after another lease, which this control plane may not
// know of: another replica released it, or the control plane restarted
// since) as being wiped, under the refused lease's ID and the node, until
// the node's heartbeats no longer list a wipe. The placement that follows
// places around it.
func (r *reserver) refusedWiping(id string, p api.Part) {
	key := refusedPrefix + id + "/" + p.DeviceID + "/" + fmt.Sprint(p.Offset)
	r.Wiping(api.Lease{ID: key, Kind: api.KindBlock, Mode: api.ModeDedicated, Parts: []api.Part{p}}, "")
}

// refusedPrefix begins the marks of ranges a lender refused as being
// wiped (refusedWiping).
const refusedPrefix = "refused/"

// waitWipes waits, within ctx, until ch (from wipesPending, taken before
// the caller's placement found no room) is closed: a range marked as
// being wiped was confirmed wiped, and may be the room the placement
// lacked. It reports false when ctx ended first.
func (s *Server) waitWipes(ctx context.Context, ch <-chan struct{}) bool {
	s.m.wipeWaits.Inc()
	defer s.m.wipeWaits.Dec()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// maxWipeLookups bounds the leases a heartbeat's Wiping list makes the
// control plane read (heartbeatWipes).
const maxWipeLookups = 64

// heartbeatWipes drops the marks on nodeID of the leases its heartbeat h
// lists neither as served nor as being wiped, and marks the ranges on
// nodeID of the leases h lists as being wiped that are not marked yet (a
// restarted control plane, or a release through another replica): their
// ended leases' parts there.
func (s *Server) heartbeatWipes(ctx context.Context, nodeID string, h api.Heartbeat) {
	s.res.WipedOn(nodeID, func(id string) bool {
		if slices.Contains(h.Leases, id) || slices.Contains(h.Wiping, id) {
			return true
		}
		// A refused range (refusedWiping) stays while the node wipes
		// anything.
		return len(h.Wiping) > 0 && strings.HasPrefix(id, refusedPrefix)
	})
	var unknown []string
	for _, id := range h.Wiping {
		if !s.res.marked(id, nodeID) && len(unknown) < maxWipeLookups {
			unknown = append(unknown, id)
		}
	}
	if len(unknown) == 0 {
		return
	}
	ls, err := s.st.Leases(ctx, store.LeaseFilter{IDs: unknown})
	if err != nil {
		s.log.Warn("heartbeat: reading the leases a lender is wiping", "node", nodeID, "err", err)
		return
	}
	for _, l := range ls {
		if l.State == api.LeaseReserved || l.State == api.LeaseActive {
			continue // its parts are in the view
		}
		on := l
		on.Parts = slices.DeleteFunc(slices.Clone(l.Parts), func(p api.Part) bool { return p.NodeID != nodeID })
		s.res.Wiping(on, "")
	}
}
