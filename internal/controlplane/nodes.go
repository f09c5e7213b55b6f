package controlplane

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"sort"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

const maxPeers = 8

// peerCache keeps the ready nodes sorted by ID, for the peer lists handed
// to agents (each gets the next maxPeers nodes after itself on the ring, so
// the probing load stays bounded with thousands of nodes).
type peerCache struct {
	mu      sync.Mutex
	nodes   []api.Node
	version uint64
	sent    map[string]uint64 // node ID → version last sent to it
}

func samePeers(a, b []api.Node) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Address != b[i].Address || a[i].AgentURL != b[i].AgentURL || a[i].Name != b[i].Name {
			return false
		}
	}
	return true
}

func (c *peerCache) set(nodes []api.Node) {
	var ready []api.Node
	for _, n := range nodes {
		if n.State == api.NodeReady {
			n.Fingerprint = api.Fingerprint{Hostname: n.Fingerprint.Hostname} // no machine ID: agents need none of their peers'
			ready = append(ready, n)
		}
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].ID < ready[j].ID })
	c.mu.Lock()
	if !samePeers(c.nodes, ready) {
		c.version++
	}
	c.nodes = ready
	c.mu.Unlock()
}

func (c *peerCache) add(n api.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.nodes), func(i int) bool { return c.nodes[i].ID >= n.ID })
	n.Fingerprint = api.Fingerprint{Hostname: n.Fingerprint.Hostname} // no machine ID: agents need none of their peers'
	c.version++
	if i < len(c.nodes) && c.nodes[i].ID == n.ID {
		c.nodes[i] = n
		return
	}
	c.nodes = append(c.nodes, api.Node{})
	copy(c.nodes[i+1:], c.nodes[i:])
	c.nodes[i] = n
}

// changedFor returns id's peers if the peer set changed since they were
// last sent to id, else nil (the agent keeps its list).
func (c *peerCache) changedFor(id string) []api.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent == nil {
		c.sent = map[string]uint64{}
	}
	if v, ok := c.sent[id]; ok && v == c.version {
		return nil
	}
	c.sent[id] = c.version
	out := c.peersOfLocked(id)
	if out == nil {
		out = []api.Node{}
	}
	return out
}

func (c *peerCache) peersOf(id string) []api.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peersOfLocked(id)
}

func (c *peerCache) peersOfLocked(id string) []api.Node {
	i := sort.Search(len(c.nodes), func(i int) bool { return c.nodes[i].ID >= id })
	var out []api.Node
	for k := 0; k < len(c.nodes) && len(out) < maxPeers; k++ {
		n := c.nodes[(i+k)%len(c.nodes)]
		if n.ID != id {
			out = append(out, n)
		}
	}
	return out
}

func validKind(k api.Kind) bool {
	switch k {
	case api.KindBlock, api.KindMemory, api.KindAccel, api.KindNIC:
		return true
	}
	return false
}

func validateJoin(r api.JoinRequest) error {
	if r.Name == "" || len(r.Name) > 128 {
		return fmt.Errorf("%w: name is required (at most 128 bytes)", ErrInvalid)
	}
	if r.Fingerprint.MachineID == "" || len(r.Fingerprint.MachineID) > api.MaxMachineIDLen {
		return fmt.Errorf("%w: fingerprint.machine_id is required (at most %d bytes)", ErrInvalid, api.MaxMachineIDLen)
	}
	if r.AgentURL != "" {
		u, err := url.Parse(r.AgentURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: agent_url %q is not an http(s) URL", ErrInvalid, r.AgentURL)
		}
	}
	if len(r.Devices) > 1024 {
		return fmt.Errorf("%w: at most 1024 devices per node", ErrInvalid)
	}
	if len(r.Credential) > api.MaxCredentialLen {
		return fmt.Errorf("%w: credential is longer than %d bytes", ErrInvalid, api.MaxCredentialLen)
	}
	if len(r.PreviousCredentials) > api.MaxPreviousCredentials {
		return fmt.Errorf("%w: at most %d previous_credentials", ErrInvalid, api.MaxPreviousCredentials)
	}
	for i, c := range r.PreviousCredentials {
		if c == "" || len(c) > api.MaxCredentialLen {
			return fmt.Errorf("%w: previous_credentials[%d] is empty or longer than %d bytes", ErrInvalid, i, api.MaxCredentialLen)
		}
	}
	seen := map[string]bool{}
	for i, d := range r.Devices {
		switch {
		case d.Name == "" || len(d.Name) > 128:
			return fmt.Errorf("%w: devices[%d]: name is required (at most 128 bytes)", ErrInvalid, i)
		case seen[d.Name]:
			return fmt.Errorf("%w: devices[%d]: duplicate name %q", ErrInvalid, i, d.Name)
		case !validKind(d.Kind):
			return fmt.Errorf("%w: devices[%d]: unknown kind %q", ErrInvalid, i, d.Kind)
		case d.Capacity <= 0:
			return fmt.Errorf("%w: devices[%d]: capacity must be positive", ErrInvalid, i)
		case d.Kind == api.KindAccel && d.Capacity > maxAccelSlots:
			return fmt.Errorf("%w: devices[%d]: %d slots is more than %d", ErrInvalid, i, d.Capacity, maxAccelSlots)
		case d.Sharing != "" && d.Sharing != "exclusive" && d.Sharing != "partitionable":
			return fmt.Errorf("%w: devices[%d]: sharing must be exclusive or partitionable", ErrInvalid, i)
		}
		seen[d.Name] = true
	}
	return nil
}

// maxAccelSlots bounds an accel device's slots.
const maxAccelSlots = 1 << 20

// slotUnitDevices returns the devices an agent offers as the store keeps
// them: an accel device's capacity in slot units (api.SlotUnits a slot),
// so that shared leases hold shares of a slot.
func slotUnitDevices(ds []api.DeviceSpec) []api.DeviceSpec {
	out := make([]api.DeviceSpec, len(ds))
	for i, d := range ds {
		if d.Kind == api.KindAccel {
			d.Capacity *= api.SlotUnits
		}
		out[i] = d
	}
	return out
}

// join registers an agent; a known machine ID keeps its node ID (joinAs
// with no certificate).
func (s *Server) join(ctx context.Context, r api.JoinRequest) (api.JoinResponse, error) {
	return s.joinAs(ctx, r, "")
}

// joinAs registers an agent whose connection presented a valid client
// certificate of node certNode ("" for none). A known machine ID keeps
// its node ID; the join takes the node over (new credential, agent key
// and certificate) when it proves it is the node's agent (the node's
// current credential in r.Credential or, after a restore of the
// database from a backup, in r.PreviousCredentials, or its certificate),
// or when the
// node is down or removed: such a takeover without proof is a lost-state
// join (the node's leases are lost, its earlier certificates revoked).
// A join without proof while the node is live is refused (409).
func (s *Server) joinAs(ctx context.Context, r api.JoinRequest, certNode string) (api.JoinResponse, error) {
	if err := validateJoin(r); err != nil {
		return api.JoinResponse{}, err
	}
	if err := s.checkJoinCSR(r); err != nil {
		return api.JoinResponse{}, err
	}
	if err := CheckAgentVersion(s.cfg.Version, r.Version); err != nil {
		s.log.Warn("join refused: agent version", "name", r.Name, "agent_version", r.Version, "version", s.cfg.Version)
		return api.JoinResponse{}, err
	}
	now := s.now()
	cred := resource.NewSecret(nodeCredentialPrefix)
	key := resource.NewSecret("rak")
	n := api.Node{
		ID: resource.NewID("node"), Name: r.Name, State: api.NodeReady, Address: r.Address, AgentURL: r.AgentURL,
		Endpoints: r.Endpoints, Labels: r.Labels, Fingerprint: r.Fingerprint, Health: "ok", LastHeartbeat: now, JoinedAt: now,
	}
	j := store.JoinNode{Node: n, CredentialHash: resource.HashSecret(cred), AgentKey: key, Devices: slotUnitDevices(r.Devices), ProofNodeID: certNode, EarlierProofHashes: hashSecrets(r.PreviousCredentials)}
	if r.Credential != "" {
		j.ProofHash = resource.HashSecret(r.Credential)
	}
	// The join is written as a heartbeat is (liveness.go): a flush under
	// way, which may have taken a heartbeat of the node's last run from
	// memory, writes it before the join, never over it (its older time,
	// and its list of wipes, would replace the join's: the sweep would
	// take the node for silent since then and forget the marks of the
	// ranges it has still to wipe), and the node's heartbeat kept in
	// memory, if any, is forgotten before a flush can take it.
	s.live.wmu.RLock()
	n, how, err := s.st.JoinNode(ctx, j,
		api.Event{At: now, Type: "node.joined", Message: fmt.Sprintf("%s joined with %d device(s)", r.Name, len(r.Devices)), State: string(api.NodeReady)})
	if err == nil {
		s.live.forget(n.ID)
	}
	s.live.wmu.RUnlock()
	var live *store.NodeLive
	if errors.As(err, &live) {
		s.log.Warn("join refused: its machine's node is live and the join did not present the node's credential",
			"name", r.Name, "node", live.Node.ID, "node_name", live.Node.Name, "state", live.Node.State, "address", r.Address,
			"presented_credential", r.Credential != "", "previous_credentials", len(r.PreviousCredentials), "presented_certificate", certNode != "")
		return api.JoinResponse{}, fmt.Errorf("%w: machine %s is node %s (%s), which is %s: a join without %s's credential (its agent's state directory) is accepted once %s is down (%s without a heartbeat), or after `rialto node remove --force %s`",
			ErrConflict, r.Fingerprint.MachineID, live.Node.ID, live.Node.Name, live.Node.State, live.Node.ID, live.Node.ID, stretch(s.cfg.DownAfter, s.heartbeatStretch()), live.Node.ID)
	}
	if err != nil {
		return api.JoinResponse{}, err
	}
	// The join is committed: what follows from it (a takeover's leases
	// lost and certificates revoked, a lost-state join's leases lost)
	// must not be given up with a request whose caller went away.
	ctx = context.WithoutCancel(ctx)
	rejoined := how.Rejoined()
	s.log.Info("node joined", "node", n.ID, "name", n.Name, "rejoined", rejoined, "proven", how == store.JoinedProven,
		"devices", len(r.Devices), "credential", resource.Fingerprint(cred), "agent_version", r.Version)
	// The agent's heartbeats to this replica find its credential.
	defer s.cachePrincipal(resource.HashSecret(cred), principal{role: roleNode, nodeID: n.ID, fp: resource.Fingerprint(cred)})
	if rejoined {
		// The node's old credential stops working here at once (other
		// replicas forget it within their cache's lifetime). Only this
		// node's entries go: with thousands of agents, emptying the cache
		// on every join would cost each of them a lookup.
		s.auth.dropNode(n.ID)
	}
	// Joined ready: its first heartbeat here, on time, need not be
	// written before the answer (liveness.go).
	s.live.wrote(store.Beat{NodeID: n.ID, At: now, Health: "ok"})
	s.peers.add(n)
	if !rejoined {
		s.rep.nodeCount.Add(1)
	}
	s.invalidate()
	out := api.JoinResponse{
		NodeID: n.ID, Credential: cred, AgentKey: key, HeartbeatSeconds: s.heartbeatInterval().Seconds(),
		ControlPlaneNodes: s.peers.peersOf(n.ID),
	}
	if how == store.JoinedTakeover || (r.LostExports && rejoined) {
		// Its leases are lost below: what the watch of those it does
		// not serve suspected is moot, and its new agent's first
		// heartbeat is checked (unserved.go).
		s.unserved.forget(n.ID)
	}
	switch {
	case how == store.JoinedTakeover:
		// Nothing says the newcomer is the machine that served the
		// node's leases (an agent that lost its state, or another
		// machine claiming the machine ID): none of them is served by it,
		// and no certificate issued to the node before opens anything.
		s.log.Warn("a join without the node's credential took the node over (it was down or removed): its leases are lost, its earlier certificates revoked",
			"node", n.ID, "name", n.Name, "address", r.Address)
		if out.LostLeases, err = s.loseNodeParts(ctx, n.ID, "its node was taken over by a join without the node's credential (a lender that lost its state, or another machine)"); err != nil {
			return api.JoinResponse{}, err
		}
		if err := s.revokeTakenOver(ctx, n.ID); err != nil {
			return api.JoinResponse{}, err
		}
	case r.LostExports && rejoined:
		// The agent wiped its block devices, knowing no longer which
		// leases they held (an unreadable exports file and
		// --wipe-lost-exports, or a state directory it started without):
		// every part on the node is gone, and none of its ranges holds a
		// tenant's bytes.
		if out.LostLeases, err = s.loseNodeParts(ctx, n.ID, "its lender lost the record of its exports (an unreadable exports file, or a lost state directory) and wiped its block devices"); err != nil {
			return api.JoinResponse{}, err
		}
	}
	if s.cfg.CA != nil {
		c, _, err := s.signNodeCSR(ctx, n, r.CSR)
		if err != nil {
			return api.JoinResponse{}, err
		}
		out.Certificate, out.CACertificate = c.Certificate, c.CACertificate
		out.CRL = string(s.cfg.CA.CRLPEM())
	}
	return out, nil
}

// hashSecrets hashes each secret (resource.HashSecret).
func hashSecrets(secrets []string) []string {
	out := make([]string, len(secrets))
	for i, x := range secrets {
		out[i] = resource.HashSecret(x)
	}
	return out
}

// revokeTakenOver revokes the certificates issued to node id before a
// join without its credential took it over (before the new one is
// signed), here and on the other replicas, which also forget its old
// credential at once.
func (s *Server) revokeTakenOver(ctx context.Context, id string) error {
	var serials []*big.Int
	if s.cfg.CA != nil {
		var err error
		if serials, err = s.revokeCerts(ctx, id, nil); err != nil {
			return fmt.Errorf("controlplane: node %s taken over: revoke its earlier certificates: %w", id, err)
		}
	}
	if late := s.broadcastRevocation(ctx, id, serials); len(late) > 0 {
		s.log.Warn("replicas did not acknowledge the revocation of a taken-over node's certificates in time; they trust no cache until they hear the others again",
			"node", id, "replicas", late)
	}
	return nil
}

// heartbeat records an agent's report and answers what to tear down: each
// lease the agent serves is reconciled by the lease state machine
// (Reconcile; its exports of parts placed elsewhere that may be adopted
// are left in doubt: doubted), the exports it moved are recorded (Moved),
// those it lost too (PartsLost), and so are the active leases on the node
// it does not serve (loseUnserved), or their parts adopted where they are
// served.
func (s *Server) heartbeat(ctx context.Context, nodeID string, h api.Heartbeat) (api.HeartbeatResponse, error) {
	if len(h.Links) > 4096 || len(h.Leases) > 65536 || len(h.Wiping) > 65536 || len(h.Moved) > 65536 || len(h.Lost) > 65536 || len(h.Exports) > 65536 || len(h.Health) > 1024 {
		return api.HeartbeatResponse{}, fmt.Errorf("%w: heartbeat too large", ErrInvalid)
	}
	if err := CheckAgentVersion(s.cfg.Version, h.Version); err != nil {
		return api.HeartbeatResponse{}, err
	}
	for _, x := range h.Lost {
		if x.LeaseID == "" || len(x.Reason) > 512 {
			return api.HeartbeatResponse{}, fmt.Errorf("%w: a lost export needs a lease ID and a reason of at most 512 bytes", ErrInvalid)
		}
	}
	now := s.now()
	links := make([]api.Link, 0, len(h.Links))
	for _, lr := range h.Links {
		if lr.To == "" || lr.RTTMicros < 0 {
			return api.HeartbeatResponse{}, fmt.Errorf("%w: links need a target and a non-negative rtt_us", ErrInvalid)
		}
		status := "down"
		if lr.Up {
			status = "up"
		}
		kind := "ethernet"
		if lr.To == nodeID {
			kind = "loopback"
		}
		links = append(links, api.Link{From: nodeID, To: lr.To, Kind: kind, RTTMicros: lr.RTTMicros, Status: status, MeasuredAt: now})
	}
	health := h.Health
	if health == "" {
		health = "ok"
	}
	prev, err := s.recordBeat(ctx, store.Beat{NodeID: nodeID, At: now, Health: health, Links: links, Wiping: h.Wiping})
	if err != nil {
		return api.HeartbeatResponse{}, err
	}
	if prev != api.NodeReady {
		s.readyAgain(ctx, nodeID, prev)
	}
	s.heartbeatWipes(ctx, nodeID, h)
	resp := api.HeartbeatResponse{Now: now, HeartbeatSeconds: s.heartbeatInterval().Seconds()}
	// The exports the node holds of active leases' parts placed elsewhere
	// that it may be adopted with (unserved.go): its claims, made anew.
	var claims, prevClaims map[string]map[int]claim
	var exports map[string][]api.ServedExport
	if h.LeasesComplete && h.ExportsComplete {
		claims, prevClaims = map[string]map[int]claim{}, s.unserved.claimsOf(nodeID)
		exports = make(map[string][]api.ServedExport, len(h.Leases))
		for _, x := range h.Exports {
			exports[x.LeaseID] = append(exports[x.LeaseID], x)
		}
	}
	if len(h.Leases) > 0 {
		// The moves coming to this node, read before the leases: a move
		// that ends after this read committed before it (or failed), so
		// the leases read next point at a destination it committed.
		incoming, err := s.incomingParts(ctx, nodeID)
		if err != nil {
			return resp, err
		}
		ls, err := s.st.Leases(ctx, store.LeaseFilter{IDs: h.Leases})
		if err != nil {
			return resp, err
		}
		byID := make(map[string]api.Lease, len(ls))
		listed := map[string]bool{}
		for _, l := range ls {
			byID[l.ID] = l
		}
		for _, id := range h.Leases {
			l, ok := byID[id]
			if !ok {
				l = api.Lease{ID: id} // unknown here: not live
			}
			todo := s.reconcileOn(ctx, l, ok, nodeID, exports[id], incoming[id], prevClaims, claims)
			if ok && claims != nil && l.State == api.LeaseActive && dropsExport(todo, exports[id]) {
				// The answer would have the node drop an export of an
				// active lease: decided from the lease as read above,
				// which a check of another node may have changed since
				// by adopting that very export (unserved.go), the
				// decision seeing the adoption (the check's result, the
				// move it recorded) but the lease not. Decided again from
				// the lease read after: it shows any adoption that
				// the first decision saw.
				fresh, err := s.st.Lease(ctx, id)
				if err != nil {
					// Left out of the answer: the node leaves its
					// exports of the lease as they are.
					s.log.Warn("heartbeat: reading again a lease whose export the lender is to drop; the next heartbeat decides", "node", nodeID, "lease", id, "err", err)
					continue
				}
				delete(claims, id)
				l = fresh
				todo = s.reconcileOn(ctx, l, true, nodeID, exports[id], incoming[id], prevClaims, claims)
			}
			for _, a := range todo {
				switch a := a.(type) {
				case lifecycle.TeardownOn:
					resp.Teardown = append(resp.Teardown, id)
					if ok {
						s.markTeardownOn(ctx, l, nodeID)
					}
				case lifecycle.KeepOn:
					if !listed[id] {
						listed[id] = true
						resp.Leases = append(resp.Leases, api.LeaseExpiry{ID: id, ExpiresAt: a.ExpiresAt, Parts: a.Parts, Doubt: a.Doubt})
					}
				}
			}
		}
		if len(h.Moved) > 0 {
			resp.Moved = s.recordMoved(ctx, nodeID, ls, h.Moved)
		}
	}
	if len(h.Lost) > 0 {
		resp.Lost = s.recordLost(ctx, nodeID, h.Lost)
	}
	if claims != nil {
		s.unserved.setClaims(nodeID, claims)
	}
	if h.LeasesComplete {
		// The active leases on the node it does not serve (unserved.go).
		resp.Check = s.loseUnserved(ctx, nodeID, h)
	}
	// Peers only when they changed since this node last heard them (an
	// agent keeps its list when the field is absent).
	resp.Peers = s.peers.changedFor(nodeID)
	// The revocation list, when the agent's is older.
	if s.cfg.CA != nil && s.cfg.CA.CRLNumber().Cmp(big.NewInt(h.CRLNumber)) > 0 {
		resp.CRL = string(s.cfg.CA.CRLPEM())
	}
	// The CA's certificates, when the agent's are others (a rotation since
	// it started): it verifies with them from then on.
	if s.cfg.CA != nil && h.CAHash != "" && h.CAHash != s.cfg.CA.CertHash() {
		resp.CACertificate = string(s.cfg.CA.CertPEM())
	}
	return resp, nil
}

// reconcileOn returns what node nodeID is to do with its exports xs of
// lease l (known: the store holds l; incoming: the parts moves under way
// bring there): lifecycle.Reconcile, told the exports to leave in doubt
// (doubted, when claims are made: prev and claims).
func (s *Server) reconcileOn(ctx context.Context, l api.Lease, known bool, nodeID string, xs []api.ServedExport, incoming []api.PartRef, prev, claims map[string]map[int]claim) []lifecycle.Action {
	var doubt []api.PartRef
	if claims != nil && known {
		doubt = s.doubted(ctx, l, nodeID, xs, incoming, prev, claims)
	}
	_, todo, _ := s.apply(ctx, l, lifecycle.Reconcile{NodeID: nodeID, Incoming: incoming, Doubt: doubt})
	return todo
}

// dropsExport reports whether todo, Reconcile's actions for a lease, has
// its node drop one of its exports xs of it: tear the lease down, or keep
// it without listing the export's range among those to serve or to leave
// in doubt.
func dropsExport(todo []lifecycle.Action, xs []api.ServedExport) bool {
	for _, a := range todo {
		switch a := a.(type) {
		case lifecycle.TeardownOn:
			return true
		case lifecycle.KeepOn:
			for _, x := range xs {
				ref := api.PartRef{DeviceID: x.DeviceID, Offset: x.Offset, Length: x.Length}
				if !slices.Contains(a.Parts, ref) && !slices.Contains(a.Doubt, ref) {
					return true
				}
			}
		}
	}
	return false
}

// recordMoved makes the URIs a lender reports for restored exports (see
// api.Heartbeat.Moved) those of its parts of the active leases in ls, and
// returns the IDs of the leases whose every reported part now carries the
// reported URI. The lease state machine checks each report (Moved): it may
// only move a part of this node to another address of the same export.
//
// The lease is read again under movedMu, so that two lenders of one lease
// reporting at once each change only their own part: after activation,
// nothing else changes a lease's part URIs.
func (s *Server) recordMoved(ctx context.Context, nodeID string, ls []api.Lease, moved []api.MovedExport) []string {
	byLease := map[string][]api.MovedExport{}
	for _, m := range moved {
		byLease[m.LeaseID] = append(byLease[m.LeaseID], m)
	}
	s.movedMu.Lock()
	defer s.movedMu.Unlock()
	var acked []string
	for _, l := range ls {
		ms := byLease[l.ID]
		if len(ms) == 0 || l.State != api.LeaseActive {
			continue
		}
		l, err := s.st.Lease(ctx, l.ID)
		if err != nil {
			continue
		}
		_, _, err = s.apply(ctx, l, lifecycle.Moved{NodeID: nodeID, Exports: ms})
		switch {
		case errors.Is(err, lifecycle.ErrRefused):
			continue // no longer active
		case errors.Is(err, lifecycle.ErrBadReport):
			s.log.Warn("lender reported a moved export that does not match its lease part; ignored", "node", nodeID, "lease", l.ID)
			continue
		case err != nil:
			s.log.Warn("recording a moved export", "node", nodeID, "lease", l.ID, "err", err)
			continue
		}
		acked = append(acked, l.ID)
	}
	return acked
}

// recordLost records lost the parts whose exports lender nodeID reports
// it lost with their data (api.Heartbeat.Lost): each such lease is lost
// (PartsLost), as it would be were the node down. It returns the IDs of
// the leases it is done with: those recorded, and those that no longer
// hold such a part (ended, moved, or not known here). A lease whose write
// failed is left out, for the next heartbeat to report again.
func (s *Server) recordLost(ctx context.Context, nodeID string, lost []api.LostExport) []string {
	byLease := map[string][]api.LostExport{}
	var ids []string
	for _, x := range lost {
		if _, ok := byLease[x.LeaseID]; !ok {
			ids = append(ids, x.LeaseID)
		}
		byLease[x.LeaseID] = append(byLease[x.LeaseID], x)
	}
	ls, err := s.st.Leases(ctx, store.LeaseFilter{IDs: ids})
	if err != nil {
		s.log.Warn("reading the leases a lender lost exports of", "node", nodeID, "err", err)
		return nil
	}
	known := map[string]api.Lease{}
	for _, l := range ls {
		known[l.ID] = l
	}
	var done []string
	for _, id := range ids {
		l, ok := known[id]
		if !ok {
			done = append(done, id) // not known here: nothing to lose
			continue
		}
		// The agent's reason, in the lease's reason: without the names
		// of its packages.
		ev := lifecycle.PartsLost{NodeID: nodeID, Why: plainWords(byLease[id][0].Reason)}
		for _, x := range byLease[id] {
			ev.Parts = append(ev.Parts, api.PartRef{DeviceID: x.DeviceID, Offset: x.Offset})
		}
		if ev.Why == "" {
			ev.Why = "its export's data is gone"
		}
		_, _, err := s.apply(ctx, l, ev)
		switch {
		case err == nil:
			s.log.Warn("lender lost a lease's export with its data; the lease is lost", "node", nodeID, "lease", id, "reason", ev.Why)
		case errors.Is(err, lifecycle.ErrRefused):
			// No longer live, or the part is no longer there.
		default:
			s.log.Warn("recording a lost export", "node", nodeID, "lease", id, "err", err)
			continue
		}
		done = append(done, id)
	}
	return done
}

// loseNodeParts records lost, for reason why, every live part on node
// nodeID: each lease holding one is lost (PartsLost), as it would be were
// the node down. It returns the leases it changed.
func (s *Server) loseNodeParts(ctx context.Context, nodeID, why string) ([]string, error) {
	ls, err := s.st.Leases(ctx, store.LeaseFilter{NodeID: nodeID, States: []api.LeaseState{api.LeaseReserved, api.LeaseActive, api.LeaseReleasing}})
	if err != nil {
		return nil, err
	}
	var lost []string
	for _, l := range ls {
		ev := lifecycle.PartsLost{NodeID: nodeID, Why: why}
		for _, p := range l.Parts {
			if p.NodeID == nodeID && !p.Lost() {
				ev.Parts = append(ev.Parts, api.PartRef{DeviceID: p.DeviceID, Offset: p.Offset})
			}
		}
		if len(ev.Parts) == 0 {
			continue
		}
		_, _, err := s.apply(ctx, l, ev)
		switch {
		case err == nil:
			s.log.Warn("lender lost the record of its exports; the lease is lost", "node", nodeID, "lease", l.ID)
			lost = append(lost, l.ID)
		case !movedOn(err):
			return lost, fmt.Errorf("controlplane: lose lease %s of node %s: %w", l.ID, nodeID, err)
		}
	}
	return lost, nil
}

// invalidate makes the next placement reload the inventory, and the next
// lender call re-read its node.
func (s *Server) invalidate() {
	s.res.Invalidate()
	s.nodes.mu.Lock()
	s.nodes.gen++
	s.nodes.m = nil
	s.nodes.mu.Unlock()
}
