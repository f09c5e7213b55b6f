package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
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
// The check is per lease, not per part: heartbeats list lease IDs. A
// lease with several parts on one node (a composed lease on two of its
// devices) whose lender serves only some of them is not found
// (docs/operations.md, "Backups and restore").

// unservedEvery is how often (in heartbeats of a node with complete lists
// handled by this replica) the leases on the node are read to find those
// it does not serve: on its first heartbeat here, and then on every
// unservedEvery-th, or every one while a lease is suspected.
const unservedEvery = 10

// unservedWhy is why a lease whose lender does not serve it is lost.
const unservedWhy = "it does not serve the lease (its heartbeats list it neither as served nor as lost: the lease may have ended there after the backup the control plane's database was restored from)"

// unservedWatch keeps, per node, the active leases with a part there that
// the node's last checked heartbeat did not list, and the check it was
// answered with.
type unservedWatch struct {
	mu     sync.Mutex
	prefix string // this process's, so that a check sent back to another one matches none
	seq    uint64
	nodes  map[string]*unservedNode
}

// unservedNode is one node's entry of unservedWatch.
type unservedNode struct {
	beats int // heartbeats with complete lists handled here
	check string
	// missing are the leases the heartbeat answered with check did not
	// list: lease ID → their parts there (unservedKey).
	missing map[string]string
}

// next counts a heartbeat of node with complete lists that sent check
// back (sent), and returns whether the leases on the node are to be read
// for it (due) and, if so, the check to answer with and the leases
// suspected before, if the agent made its lists after reading the answer
// that suspected them.
func (w *unservedWatch) next(node, sent string) (due bool, check string, suspects map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.prefix == "" {
		var b [6]byte
		rand.Read(b[:])
		w.prefix = hex.EncodeToString(b[:])
	}
	if w.nodes == nil {
		w.nodes = map[string]*unservedNode{}
	}
	n := w.nodes[node]
	if n == nil {
		n = &unservedNode{}
		w.nodes[node] = n
	}
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
func (w *unservedWatch) set(node, check string, missing map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := w.nodes[node]; n != nil {
		n.check, n.missing = check, missing
	}
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

// unservedKey names lease l's live parts on node (their URIs): a lease
// whose parts there changed since it was suspected (a move away and back)
// is suspected anew. "" if it has none there.
func unservedKey(l api.Lease, node string) string {
	var uris []string
	for _, p := range l.Parts {
		if p.NodeID == node && !p.Lost() {
			uris = append(uris, p.DeviceID+"@"+strconv.FormatInt(p.Offset, 10)+"="+p.URI)
		}
	}
	return strings.Join(uris, " ")
}

// loseUnserved records lost the parts on node nodeID of the active leases
// that its heartbeat h (with complete lists) does not list, as the
// heartbeat answered with the check h sends back did not either, and
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
	for _, x := range h.Lost {
		listed[x.LeaseID] = true // recordLost's
	}
	missing := map[string]string{}
	var lose []api.Lease
	for _, l := range ls {
		if listed[l.ID] {
			continue
		}
		k := unservedKey(l, nodeID)
		switch {
		case k == "":
		case suspects[l.ID] == k:
			lose = append(lose, l)
		default:
			missing[l.ID] = k
		}
	}
	for _, l := range lose {
		ev := lifecycle.PartsLost{NodeID: nodeID, Why: unservedWhy}
		for _, p := range l.Parts {
			if p.NodeID == nodeID && !p.Lost() {
				ev.Parts = append(ev.Parts, api.PartRef{DeviceID: p.DeviceID, Offset: p.Offset})
			}
		}
		_, _, err := s.apply(ctx, l, ev)
		switch {
		case err == nil:
			s.log.Warn("lender does not serve an active lease (the control plane's database restored from an older backup?); the lease is lost",
				"node", nodeID, "lease", l.ID)
		case errors.Is(err, lifecycle.ErrRefused), errors.Is(err, store.ErrConflict):
			// It moved on meanwhile.
		default:
			s.log.Warn("recording a lease its lender does not serve lost", "node", nodeID, "lease", l.ID, "err", err)
			missing[l.ID] = suspects[l.ID] // suspected still: tried again with the next heartbeat
		}
	}
	s.unserved.set(nodeID, check, missing)
	return check
}
