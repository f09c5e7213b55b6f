package controlplane

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

// This file records lost the active leases a lender does not serve: those
// its heartbeats, which list everything it holds (api.Heartbeat.
// LeasesComplete), do not list. The store and the lender disagree like
// this after a restore of the control plane's database from a backup: a
// lease active at the backup may have been released since, its export
// torn down and its range wiped on the lender; left active, it would hold its
// range and its tenant's quota for good, and its borrower would find
// nothing to attach to (docs/operations.md, "Backups and restore").
//
// A heartbeat's lists may be older than the leases the control plane
// reads while it answers: a prepare, or a move's commit here, may have
// made an export (and then the control plane a lease active on it) after
// the lists were made. So one heartbeat proves nothing: the answer names
// itself (api.HeartbeatResponse.Check), and a lease is lost only when a
// heartbeat that sends that check back (api.Heartbeat.Check), whose lists
// the agent made after reading the answer, does not list it either, its
// parts on the node unchanged. The lender serves every part before the
// control plane makes the lease point at it (a prepare's export before
// its lease is active, a move's destination before its commit), so the
// later heartbeat lists every lease that had a part on the node when the
// control plane read the leases for the answer, unless the lender no
// longer serves it. A restarted agent restores its exports before it
// joins, held until confirmed, and lists them from its first heartbeat,
// as it lists those a restart lost (Lost), which recordLost records.
//
// The check is per part when the heartbeat lists the exports by part
// (api.Heartbeat.ExportsComplete): a lease with two parts on the node
// whose lender serves one of them does not serve the other. An older
// agent lists lease IDs only: its check is per lease.
//
// A part its recorded lender does not serve may be served by another
// (or by the same lender at another range): the database restored from a
// backup taken before the part moved there. Such a holder's heartbeats
// list an export of an active lease the store does not place there; if a
// move brought it and its name is the one the control plane derives for a
// part of the lease and that move (the export's URI carries it:
// partOfExport), and the store does not record that move as committed
// (the part left the holder since: a stale copy), the holder is not told
// to tear it down while the part's recorded lender is not known to serve it
// (unservedWatch.inDoubt): the export is a claim on the part
// (unservedNode.claims). When the recorded lender's heartbeats show it
// does not serve the part, the part is adopted where it is served
// (lifecycle.PartAdopted: a move recorded done at once) if one lender
// claims it, and lost otherwise. A lender not heard yet since this
// replica started may hold it: a part no one claims waits for every live
// lender to be heard (up to unservedEvery more checks) before it is lost.
// Claims are kept by the replica that hears them: with replicas, the
// holder and the recorded lender have to report to the same one for the
// part to be adopted.

// unservedEvery is how often (in heartbeats of a node with complete lists
// handled by this replica) the leases on the node are read to find those
// it does not serve: on its first heartbeat here, and then on every
// unservedEvery-th, or every one while a lease is suspected.
const unservedEvery = 10

// unservedWhy is why a lease whose lender does not serve it is lost.
const unservedWhy = "it does not serve the lease (its heartbeats list it neither as served nor as lost: the lease may have ended there after the backup the control plane's database was restored from)"

// unservedPartsWhy is why a lease is lost whose lender serves some of
// its parts there, not parts (their indexes, in words).
func unservedPartsWhy(parts string) string {
	return "it does not serve part " + parts + " of the lease (its heartbeats list the lease's other exports there, not that part's: the part may have moved away after the backup the control plane's database was restored from)"
}

// maxDoubt bounds how many heartbeats of a lender an export it holds is
// left in doubt (neither served anew nor torn down) while the part's
// recorded lender is not known to serve it: past it, the export is torn
// down as any export of a part the store does not place there.
const maxDoubt = 3 * unservedEvery

// unservedWatch keeps, per node, the active leases with a part there that
// the node's last checked heartbeat did not list, and the check it was
// answered with; and the exports the node holds of parts the store
// places elsewhere (claims).
type unservedWatch struct {
	mu     sync.Mutex
	prefix string // this process's, so that a check sent back to another one matches none
	seq    uint64
	nodes  map[string]*unservedNode
}

// unservedNode is one node's entry of unservedWatch. It exists once a
// heartbeat of the node with complete lists was heard here.
type unservedNode struct {
	beats int // heartbeats with complete lists handled here
	check string
	// checked: the leases on the node were read for a heartbeat, and
	// missing says what that heartbeat did not list.
	checked bool
	// missing are the leases the heartbeat answered with check did not
	// list: lease ID → their parts there it does not serve.
	missing map[string]suspect
	// claims are the exports the node holds of active leases' parts the
	// store places elsewhere (doubted): lease ID → part → claim.
	claims map[string]map[int]claim
}

// suspect is a lease with parts on a node that its heartbeat did not
// list.
type suspect struct {
	key   string // unservedKey of those parts
	waits int    // checks it stayed suspected since, its parts claimed by no lender heard
}

// claim is an export a node holds of a part the store places elsewhere.
type claim struct {
	x     api.ServedExport
	beats int       // heartbeats of the node that left it in doubt
	at    time.Time // when the node's last heartbeat made it
	// copies the node holds of the part (at several ranges: moves brought
	// it there twice, the first copy not let go). More than one is no
	// claim: which the borrower wrote last is not known.
	copies int
	// known: the store records x.Move, not committed (a move it took
	// for failed: the database restored from a backup taken while it was
	// under way). The adoption is recorded under another ID.
	known bool
}

// claimant is a node's claim on a part.
type claimant struct {
	node string
	claim
}

// entry returns node's entry, made if need be; w.mu is held.
func (w *unservedWatch) entry(node string) *unservedNode {
	if w.nodes == nil {
		w.nodes = map[string]*unservedNode{}
	}
	n := w.nodes[node]
	if n == nil {
		n = &unservedNode{}
		w.nodes[node] = n
	}
	return n
}

// next counts a heartbeat of node with complete lists that sent check
// back (sent), and returns whether the leases on the node are to be read
// for it (due) and, if so, the check to answer with and the leases
// suspected before, if the agent made its lists after reading the answer
// that suspected them.
func (w *unservedWatch) next(node, sent string) (due bool, check string, suspects map[string]suspect) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.prefix == "" {
		var b [6]byte
		rand.Read(b[:])
		w.prefix = hex.EncodeToString(b[:])
	}
	n := w.entry(node)
	due = len(n.missing) > 0 || n.beats%unservedEvery == 0
	n.beats++
	if !due {
		return false, "", nil
	}
	if sent != "" && sent == n.check {
		suspects = n.missing
	}
	w.seq++
	return true, w.prefix + "." + strconv.FormatUint(w.seq, 10), suspects
}

// set records the leases the heartbeat of node answered with check did
// not list.
func (w *unservedWatch) set(node, check string, missing map[string]suspect) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := w.nodes[node]; n != nil {
		n.check, n.missing, n.checked = check, missing, true
	}
}

// inDoubt reports whether node holder, the recorded lender of a part of
// lease id (piece: the part's unservedKey), is not known here to serve
// it: it was not checked here yet (not heard since this replica started,
// or its first heartbeat's check under way), or its last checked
// heartbeat did not list the part.
func (w *unservedWatch) inDoubt(holder, id, piece string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nodes[holder]
	if n == nil || !n.checked {
		return true
	}
	sus, ok := n.missing[id]
	return ok && slices.Contains(strings.Fields(sus.key), piece)
}

// claimsOf returns node's claims (read only).
func (w *unservedWatch) claimsOf(node string) map[string]map[int]claim {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := w.nodes[node]; n != nil {
		return n.claims
	}
	return nil
}

// setClaims records node's claims, as its last heartbeat made them.
func (w *unservedWatch) setClaims(node string, claims map[string]map[int]claim) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.entry(node).claims = claims
}

// claimants returns the nodes that claim part i of lease id, with a
// heartbeat heard here since since: a node silent here since then may
// have gone (down, and taken over by a join on another replica), or
// report to another replica, where it may have let the part go.
func (w *unservedWatch) claimants(id string, i int, since time.Time) []claimant {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []claimant
	for node, n := range w.nodes {
		if c, ok := n.claims[id][i]; ok && !c.at.Before(since) {
			out = append(out, claimant{node: node, claim: c})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].node < out[b].node })
	return out
}

// heard reports whether every node in nodes that is ready or suspect was
// heard here with complete lists (it has an entry).
func (w *unservedWatch) heard(nodes []api.Node) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range nodes {
		if n.State != api.NodeReady && n.State != api.NodeSuspect {
			continue
		}
		if _, ok := w.nodes[n.ID]; !ok {
			return false
		}
	}
	return true
}

// forget drops node's entry: the node was removed, or taken over by a
// join that lost its leases (a takeover without proof, a lost-state
// join), which its suspicions were about. A node heard again starts
// anew: its next heartbeat with complete lists is checked, as its first.
func (w *unservedWatch) forget(node string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.nodes, node)
}

// unservedKey names lease l's parts idx (their devices, offsets and
// URIs): a lease whose parts there changed since it was suspected (a
// move away and back) is suspected anew. "" for none.
func unservedKey(l api.Lease, idx []int) string {
	pieces := make([]string, 0, len(idx))
	for _, i := range idx {
		pieces = append(pieces, partPiece(l.Parts[i]))
	}
	return strings.Join(pieces, " ")
}

// partPiece is part p's word in an unservedKey.
func partPiece(p api.Part) string {
	return p.DeviceID + "@" + strconv.FormatInt(p.Offset, 10) + "=" + p.URI
}

// partOfExport returns the index of the part of lease l whose export name
// the URI of x, an export a move brought to a lender, carries: the name the
// control plane derives from the lease's credential for that part and x's
// move (movedExport); -1 if it is none of them. A lender knows such a name
// only if a control plane gave it the part (or the borrower, who holds the
// credential).
func partOfExport(l api.Lease, x api.ServedExport) int {
	if x.Move == "" || len(x.Move) > 256 || len(x.URI) > 4096 || l.Credential == "" {
		return -1
	}
	name, err := exportOf(x.URI)
	if err != nil {
		return -1
	}
	for i := range l.Parts {
		if hmac.Equal([]byte(name), []byte(movedExport(l.Credential, i, x.Move))) {
			if !lifecycle.AdoptableURI(l.Parts[i].URI, x.URI) {
				return -1 // not an address to send the borrower to
			}
			return i
		}
	}
	return -1
}

// doubted returns the exports xs, which node nodeID holds of active lease
// l, that the store places neither there nor as the destination of a move
// under way there (incoming), and that the control plane may adopt: each
// carries the name it derives for a part of l that is not lost, of the
// part's length, whose recorded lender is not known to serve it
// (inDoubt), brought by a move the store does not record as committed
// (recordedMoves), and was left in doubt for at most maxDoubt heartbeats of the
// node (prev: its claims before this heartbeat). It records them in
// claims. The node is told neither to serve nor to tear them down.
func (s *Server) doubted(ctx context.Context, l api.Lease, nodeID string, xs []api.ServedExport, incoming []api.PartRef, prev, claims map[string]map[int]claim) []api.PartRef {
	if l.State != api.LeaseActive {
		return nil
	}
	var moves map[string]bool // the lease's recorded moves: ID → committed
	var out []api.PartRef
	for _, x := range xs {
		ref := api.PartRef{DeviceID: x.DeviceID, Offset: x.Offset, Length: x.Length}
		if slices.Contains(incoming, ref) || slices.ContainsFunc(l.Parts, func(p api.Part) bool {
			return p.NodeID == nodeID && p.DeviceID == x.DeviceID && p.Offset == x.Offset && !p.Lost()
		}) {
			continue
		}
		i := partOfExport(l, x)
		if i < 0 || l.Parts[i].Lost() || l.Parts[i].Length != x.Length {
			continue
		}
		c := claim{x: x, beats: 1, at: s.now()}
		if was, ok := prev[l.ID][i]; ok && was.x == x {
			c.beats = was.beats + 1
		}
		if c.beats > maxDoubt {
			s.log.Warn("a lender holds a part of an active lease the control plane places on another lender, which was not shown not to serve it; the copy is torn down",
				"node", nodeID, "lease", l.ID, "part", i, "recorded_on", l.Parts[i].NodeID)
			continue
		}
		p := l.Parts[i]
		if !s.unserved.inDoubt(p.NodeID, l.ID, partPiece(p)) {
			continue // a stale copy (a move's source that did not let go)
		}
		if moves == nil {
			var err error
			if moves, err = s.recordedMoves(ctx, l.ID); err != nil {
				// Left in doubt without a claim: this heartbeat adopts
				// nothing, the next reads again.
				s.log.Warn("heartbeat: reading the moves of a lease a lender holds a part of that the store places elsewhere", "node", nodeID, "lease", l.ID, "err", err)
				out = append(out, ref)
				continue
			}
		}
		committed, known := moves[x.Move]
		if committed {
			// The store knows the move that brought it there, and that the
			// part left since: a stale copy (a move's source that did not
			// let go, or a lender replaying the address it was once given).
			s.log.Warn("a lender holds a copy of an active lease's part from a move the part left since; the copy is torn down",
				"node", nodeID, "lease", l.ID, "part", i, "move", x.Move, "recorded_on", p.NodeID)
			continue
		}
		c.known, c.copies = known, 1
		if claims[l.ID] == nil {
			claims[l.ID] = map[int]claim{}
		}
		if was, ok := claims[l.ID][i]; ok {
			c.copies = was.copies + 1
		}
		claims[l.ID][i] = c
		out = append(out, ref)
	}
	return out
}

// loseUnserved records lost the parts on node nodeID of the active leases
// that its heartbeat h (with complete lists) does not list, as the
// heartbeat answered with the check h sends back did not either (or
// adopts them where another lender serves them: settleUnserved), and
// returns the check to answer h with ("" when it did not read the leases).
func (s *Server) loseUnserved(ctx context.Context, nodeID string, h api.Heartbeat) string {
	due, check, suspects := s.unserved.next(nodeID, h.Check)
	if !due {
		return ""
	}
	ls, err := s.st.Leases(ctx, store.LeaseFilter{NodeID: nodeID, States: []api.LeaseState{api.LeaseActive}})
	if err != nil {
		s.log.Warn("heartbeat: reading the leases on the node to find those it does not serve", "node", nodeID, "err", err)
		return "" // the agent keeps sending the last check back
	}
	listed := make(map[string]bool, len(h.Leases)+len(h.Lost))
	for _, id := range h.Leases {
		listed[id] = true
	}
	lost := make(map[string]bool, len(h.Lost))
	for _, x := range h.Lost {
		lost[x.LeaseID] = true // recordLost's
	}
	type at struct {
		lease, device string
		offset        int64
	}
	served := make(map[at]bool, len(h.Exports))
	for _, x := range h.Exports {
		served[at{x.LeaseID, x.DeviceID, x.Offset}] = true
	}
	missing := map[string]suspect{}
	var decide []unservedLease
	for _, l := range ls {
		if lost[l.ID] {
			continue
		}
		var idx []int
		for i, p := range l.Parts {
			if p.NodeID != nodeID || p.Lost() {
				continue
			}
			if h.ExportsComplete && !served[at{l.ID, p.DeviceID, p.Offset}] || !h.ExportsComplete && !listed[l.ID] {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			continue
		}
		k := unservedKey(l, idx)
		if sus, ok := suspects[l.ID]; ok && sus.key == k {
			decide = append(decide, unservedLease{l: l, parts: idx, sus: sus, listed: listed[l.ID]})
		} else {
			missing[l.ID] = suspect{key: k}
		}
	}
	var heard *bool
	for _, u := range decide {
		if again, ok := s.settleUnserved(ctx, nodeID, u, func() bool {
			if heard == nil {
				nodes, err := s.st.Nodes(ctx)
				all := err == nil && s.unserved.heard(nodes)
				heard = &all
			}
			return *heard
		}); ok {
			missing[u.l.ID] = again
		}
	}
	s.unserved.set(nodeID, check, missing)
	return check
}

// unservedLease is an active lease whose parts (indexes) on a node two
// checked heartbeats of the node did not list; listed: the last one
// listed the lease (it serves its other parts there).
type unservedLease struct {
	l      api.Lease
	parts  []int
	sus    suspect
	listed bool
}

// settleUnserved adopts u's parts on node nodeID where other lenders (or
// the node, at another range) serve them, if each is claimed by one
// lender, or records them lost; heard reports whether every live lender
// was heard here. It returns the lease's suspicion to keep, and true, if
// it is to be decided at the next check: some part is claimed by no
// lender heard while others were not heard yet, or a copy's range is
// taken (both for at most unservedEvery checks), or the write failed.
func (s *Server) settleUnserved(ctx context.Context, nodeID string, u unservedLease, heard func() bool) (suspect, bool) {
	l := u.l
	claimed := map[int]claimant{}
	var unclaimed []int
	var ambiguous []string
	// A claim is that of a node heard lately: one silent for longer is
	// suspect at least, and may be down and taken over since.
	since := s.now().Add(-stretch(s.cfg.SuspectAfter, s.heartbeatStretch()))
	for _, i := range u.parts {
		switch cs := s.unserved.claimants(l.ID, i, since); len(cs) {
		case 0:
			unclaimed = append(unclaimed, i)
		case 1:
			if cs[0].copies > 1 {
				ambiguous = append(ambiguous, fmt.Sprintf("part %d is held by node %s at %d ranges, and none is adopted", i, cs[0].node, cs[0].copies))
				break
			}
			claimed[i] = cs[0]
		default:
			nodes := make([]string, len(cs))
			for k, c := range cs {
				nodes[k] = c.node
			}
			ambiguous = append(ambiguous, fmt.Sprintf("part %d is held by nodes %s, and none is adopted", i, strings.Join(nodes, ", ")))
		}
	}
	if len(unclaimed) > 0 && u.sus.waits < unservedEvery && !heard() {
		// A lender not heard yet may hold it.
		return suspect{key: u.sus.key, waits: u.sus.waits + 1}, true
	}
	why := unservedWhy
	if u.listed {
		why = unservedPartsWhy(joinParts(u.parts))
	}
	if len(ambiguous) > 0 {
		why += "; " + strings.Join(ambiguous, "; ")
	}
	if len(unclaimed) == 0 && len(ambiguous) == 0 {
		adopted := true
		for _, i := range u.parts {
			var err error
			if l, err = s.adopt(ctx, l, i, claimed[i]); err != nil {
				switch {
				case errors.Is(err, store.ErrCapacity) && u.sus.waits < unservedEvery:
					// The copy's range may be freed soon: the restored
					// database may place there a lease its holder no
					// longer serves, lost at the holder's own check.
					s.log.Info("a lease part's copy cannot be adopted yet; tried again at the next check",
						"node", nodeID, "lease", l.ID, "part", i, "to", claimed[i].node, "err", err)
					return suspect{key: u.sus.key, waits: u.sus.waits + 1}, true
				case errors.Is(err, store.ErrCapacity):
					why = fmt.Sprintf("it does not serve part %d of the lease, and the copy node %s holds could not be adopted: %s", i, claimed[i].node, plainText(err))
				case movedOn(err):
					return suspect{}, false // it moved on meanwhile
				default:
					s.log.Warn("adopting a lease part where it is served", "node", nodeID, "lease", l.ID, "part", i, "to", claimed[i].node, "err", err)
					return u.sus, true // tried again with the next heartbeat
				}
				adopted = false
				break
			}
		}
		if adopted {
			return suspect{}, false
		}
	}
	ev := lifecycle.PartsLost{NodeID: nodeID, Why: why}
	for _, i := range u.parts {
		if p := l.Parts[i]; p.NodeID == nodeID && !p.Lost() {
			ev.Parts = append(ev.Parts, api.PartRef{DeviceID: p.DeviceID, Offset: p.Offset})
		}
	}
	_, _, err := s.apply(ctx, l, ev)
	switch {
	case err == nil:
		s.log.Warn("lender does not serve an active lease's part (the control plane's database restored from an older backup?); the lease is lost",
			"node", nodeID, "lease", l.ID, "parts", joinParts(u.parts))
	case movedOn(err):
		// It moved on meanwhile.
	default:
		s.log.Warn("recording a lease its lender does not serve lost", "node", nodeID, "lease", l.ID, "err", err)
		return u.sus, true // suspected still: tried again with the next heartbeat
	}
	return suspect{}, false
}

// recordedMoves returns lease id's recorded moves: ID → committed.
func (s *Server) recordedMoves(ctx context.Context, id string) (map[string]bool, error) {
	mv, ok := s.st.(store.Mover)
	if !ok {
		return map[string]bool{}, nil // no moves recorded (nor adoptions)
	}
	ms, err := mv.Moves(ctx, store.MoveFilter{LeaseID: id})
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ms))
	for _, m := range ms {
		out[m.ID] = m.Committed
	}
	return out, nil
}

// adopt makes c's export part i of active lease l (lifecycle.PartAdopted)
// and returns the lease as stored after it. The adoption is recorded as
// the move that brought the export there (its ID, which the store does
// not know), done: a copy that this move brought is known as stale once
// the part moves on (doubted).
func (s *Server) adopt(ctx context.Context, l api.Lease, i int, c claimant) (api.Lease, error) {
	now := s.now()
	p := l.Parts[i]
	id := c.x.Move
	if c.known {
		id = resource.NewID("move")
	}
	m := api.Move{ID: id, LeaseID: l.ID, Part: i, Kind: l.Kind, State: api.MoveDone,
		From: stripURI(p), To: api.Part{NodeID: c.node, DeviceID: c.x.DeviceID, Offset: c.x.Offset, Length: c.x.Length},
		Size: p.Length, Reason: "adopted where it is served: its recorded lender does not serve it",
		StartedAt: now, UpdatedAt: now}
	next, _, err := s.apply(ctx, l, lifecycle.PartAdopted{Move: m, URI: c.x.URI})
	if err != nil {
		return l, err
	}
	return next, nil
}

// joinParts is a list of part indexes in words ("1", "0 and 1").
func joinParts(idx []int) string {
	w := make([]string, len(idx))
	for k, i := range idx {
		w[k] = strconv.Itoa(i)
	}
	if len(w) <= 1 {
		return strings.Join(w, "")
	}
	return strings.Join(w[:len(w)-1], ", ") + " and " + w[len(w)-1]
}
