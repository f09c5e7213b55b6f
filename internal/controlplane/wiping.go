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
// A lease lost with its lender (down, taken over, its exports lost) is
// torn down on its other lenders only; the lost lender's ranges are
// marked all the same (lifecycle.Teardown): it still holds the tenant's
// bytes, wipes them once a heartbeat answer tells it to tear the lease
// down, and only its heartbeats (or its node's removal) drop the marks.
//
// Replicas of a shared store (store.Wiper) keep the marks in the store
// too, so that each replica's placement sees the others' marks and the
// store refuses a range being wiped to a new part (ErrCapacity) as it
// refuses a live one: a mark is written before its lender is told to
// tear the lease down; it goes when the lender answers the teardown, or
// when the elected replica's sweep finds that the node's last heartbeat
// (recorded by any replica, with its wiping list) no longer lists it
// (clearWipes). A replica's view takes the stored marks at each load, in
// place of its own.

// wipeKey is the view's lease ID for the ranges of lease id on node
// being wiped.
func wipeKey(id, node string) string { return wipePrefix + id + ":" + node }

// wipePrefix begins the view's lease IDs of ranges being wiped.
const wipePrefix = "wiping:"

// Wiping marks lease id's block parts (but the lost ones, and those on
// node except: a removed node's) as being wiped, until Wiped. Parts of
// other kinds are not wiped: they are not marked, but in a range a lender
// refused (refusedWiping), whatever its kind.
func (r *reserver) Wiping(l api.Lease, except string) {
	byNode := map[string][]store.LivePart{}
	for _, w := range wipesOf(l, except, time.Time{}) {
		for _, p := range w.Parts {
			byNode[w.NodeID] = append(byNode[w.NodeID], store.LivePart{Part: p, LeaseID: wipeKey(l.ID, w.NodeID), Mode: l.Mode})
		}
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

// wipesOf are lease l's block parts (but the lost ones, and those on node
// except) by node, as the store records them being wiped at at; a range a
// lender refused (refusedWiping) whatever its kind.
func wipesOf(l api.Lease, except string, at time.Time) []store.Wipe {
	if l.Kind != api.KindBlock && !strings.HasPrefix(l.ID, refusedPrefix) {
		return nil
	}
	var out []store.Wipe
	idx := map[string]int{}
	for _, p := range l.Parts {
		if p.Lost() || p.NodeID == except || p.Length <= 0 {
			continue
		}
		i, ok := idx[p.NodeID]
		if !ok {
			i = len(out)
			idx[p.NodeID] = i
			out = append(out, store.Wipe{LeaseID: l.ID, NodeID: p.NodeID, Mode: l.Mode, At: at})
		}
		out[i].Parts = append(out[i].Parts, api.Part{NodeID: p.NodeID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
	}
	return out
}

// loadWipes replaces the view's marks with the store's (a shared store):
// the marks of every replica, as the store keeps them, read after the
// view's live parts (a lease that ended in between is then read either
// live or marked). r.mu is held.
func (r *reserver) loadWipes(ctx context.Context, w store.Wiper) error {
	ws, err := w.Wipes(ctx)
	if err != nil {
		return fmt.Errorf("reading the ranges being wiped: %w", err)
	}
	r.wiping = nil
	for _, x := range ws {
		if r.wiping == nil {
			r.wiping = map[string]map[string][]store.LivePart{}
		}
		m := r.wiping[x.LeaseID]
		if m == nil {
			m = map[string][]store.LivePart{}
			r.wiping[x.LeaseID] = m
		}
		for _, p := range x.Parts {
			m[x.NodeID] = append(m[x.NodeID], store.LivePart{Part: p, LeaseID: wipeKey(x.LeaseID, x.NodeID), Mode: x.Mode})
		}
	}
	return nil
}

// enterWipes enters lease id's ranges being wiped in the view, which no
// longer holds the lease's parts, as ranges of their device's kind (as a
// view loaded afresh reads them: snapshot): a refused accel slot
// taken for a block range of a dedicated lease would hold its whole
// device. r.mu is held and the view loaded.
func (r *reserver) enterWipes(id string) {
	for n, ps := range r.wiping[id] {
		k := wipeKey(id, n)
		if _, ok := r.parts[k]; !ok && len(ps) > 0 {
			r.enter(k, r.kind(ps[0].DeviceID), ps)
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
// so, a channel closed when a mark goes. A view to be reloaded is loaded
// first: on a shared store the marks come with it.
func (r *reserver) wipesPending(ctx context.Context) (<-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shared {
		r.load(ctx) // an error is Place's to report
	}
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
// since), or because the lender still serves it for another lease (a
// lost lease it has not been told to tear down yet: a removed node that
// joined again, a control plane that forgot its marks in a restart), as
// being wiped, under the refused lease's ID and the node, until the
// node's heartbeats no longer list a wipe (the answer to a heartbeat
// listing a lost lease as served marks its ranges: markTeardownOn). The
// placement that follows places around it. The mark takes the refused
// lease's kind (a range of a memory, accel or NIC device is refused when
// still served too) and mode: that of a partition holds the range only (a
// dedicated mark would hold the whole device, and leave a lease that fits
// beside the range no room; a dedicated accel lease's slots are a
// partition of their device).
func (s *Server) refusedWiping(ctx context.Context, l api.Lease, p api.Part) {
	key := refusedPrefix + l.ID + "/" + p.DeviceID + "/" + fmt.Sprint(p.Offset)
	s.markWiping(ctx, api.Lease{ID: key, Kind: l.Kind, Mode: l.Mode, Parts: []api.Part{p}}, "")
}

// markWiping marks lease l's block parts (but those on node except: a
// removed node's) as being wiped (reserver.Wiping) and, on a shared
// store, records them there for the other replicas, before the caller
// tells the lenders to tear the lease down. A mark the store did not
// take is logged: the lender refusing the range (refusedWiping) remains.
func (s *Server) markWiping(ctx context.Context, l api.Lease, except string) {
	if w, ok := s.wiper(); ok {
		if ws := wipesOf(l, except, s.now()); len(ws) > 0 {
			if err := w.MarkWiping(ctx, ws); err != nil {
				s.log.Warn("recording the ranges being wiped for the other replicas", "lease", l.ID, "err", err)
			}
		}
	}
	s.res.Wiping(l, except)
}

// markTeardownOn marks the ranges on node of ended lease l as being
// wiped, before a heartbeat's answer tells its lender to tear the lease
// down (the lender missed the teardown, or the control plane forgot its
// mark): the lender wipes them from then on, and its heartbeat, which
// listed the lease as served, did not list them as being wiped. On a
// shared store the mark takes the time of this answer, so that the sweep
// forgets it only on a heartbeat sent after the lender had the answer
// (clearWipes); it stays in the view until a heartbeat of the node lists
// the lease neither as served nor as being wiped (heartbeatWipes).
func (s *Server) markTeardownOn(ctx context.Context, l api.Lease, node string) {
	if l.Kind != api.KindBlock || l.State == api.LeaseReserved || l.State == api.LeaseActive {
		return // a live lease's parts are in the view
	}
	on := l
	on.Parts = slices.DeleteFunc(slices.Clone(l.Parts), func(p api.Part) bool { return p.NodeID != node })
	s.markWiping(ctx, on, "")
}

// wiped drops the marks of lease id's ranges on node, here and in a
// shared store: its lender confirmed their wipe.
func (s *Server) wiped(ctx context.Context, id, node string) {
	s.res.Wiped(id, node)
	if w, ok := s.wiper(); ok {
		if err := w.Unwipe(ctx, id, node); err != nil {
			s.log.Warn("forgetting a wiped range for the other replicas (the sweep forgets it after the lender's next heartbeat)", "lease", id, "node", node, "err", err)
		}
	}
}

// wiper is the store's record of ranges being wiped, when the store is
// shared with other replicas.
func (s *Server) wiper() (store.Wiper, bool) {
	if !s.shared() {
		return nil, false
	}
	w, ok := s.st.(store.Wiper)
	return w, ok
}

// clearWipes (the elected replica's sweep) forgets the stored marks that
// the nodes' last heartbeats no longer list as being wiped. settle covers
// a teardown on its way to the lender when its heartbeat was sent, and
// the replicas' clocks (the mark's time is one replica's, the
// heartbeat's another's).
func (s *Server) clearWipes(ctx context.Context) error {
	w, ok := s.wiper()
	if !ok {
		return nil
	}
	n, err := w.ClearWipes(ctx, s.cfg.PrepareTimeout+s.cfg.HeartbeatInterval)
	if err != nil {
		return fmt.Errorf("forgetting the wiped ranges: %w", err)
	}
	if n > 0 {
		s.res.Invalidate() // the view reloads the marks left
	}
	return nil
}

// refusedPrefix begins the marks of ranges a lender refused as being
// wiped (refusedWiping).
const refusedPrefix = "refused/"

// waitWipes waits, within ctx, until ch (from wipesPending, taken before
// the caller's placement found no room) is closed: a range marked as
// being wiped was confirmed wiped, and may be the room the placement
// lacked. It reports false when ctx ended first.
//
// On a shared store another replica may see the wipe confirmed (its
// lender's teardown answer or heartbeat): the wait then also ends after
// a heartbeat interval, with the view to be reloaded with the store's
// marks.
func (s *Server) waitWipes(ctx context.Context, ch <-chan struct{}) bool {
	s.m.wipeWaits.Inc()
	defer s.m.wipeWaits.Dec()
	var recheck <-chan time.Time
	if _, ok := s.wiper(); ok {
		t := s.clock.NewTimer(s.cfg.HeartbeatInterval)
		defer t.Stop()
		recheck = t.C()
	}
	select {
	case <-ch:
		return true
	case <-recheck:
		s.res.Invalidate()
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
		s.markWiping(ctx, on, "")
	}
}
