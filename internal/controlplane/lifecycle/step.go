package lifecycle

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// MaxPrepareRounds is how many times a reservation is prepared (and, when
// lenders do not confirm, placed again without them) before it fails.
const MaxPrepareRounds = 8

var (
	// ErrRefused is matched by Step's refusals (*Refusal).
	ErrRefused = errors.New("lifecycle: refused")
	// ErrBadReport: a lender reported something that does not match the
	// lease (Moved).
	ErrBadReport = errors.New("lifecycle: report does not match the lease")
)

// Refusal is Step's error for an event that the lease's state (or the
// event's condition) does not allow. It matches ErrRefused.
type Refusal struct {
	Why string // in the API's words, e.g. "lease L is expired; only reserved or active leases renew"
}

func (r *Refusal) Error() string        { return "lifecycle: " + r.Why }
func (r *Refusal) Is(target error) bool { return target == ErrRefused }

func refuse(format string, args ...any) error {
	return &Refusal{Why: fmt.Sprintf(format, args...)}
}

// word is a state in a refusal: "" is a lease not read.
func word(s api.LeaseState) string {
	if s == "" {
		return "unread"
	}
	return string(s)
}

// Step returns lease l after event ev at time now, and the actions that
// make it so (see the package documentation). The lease it returns is the
// one the actions' write will store; the store's answer to the write is
// authoritative. On a refusal (or an event it cannot apply) it returns l
// unchanged and an error; a refused Confirm or PrepareFailed still asks for
// Teardown.
//
// A lease the caller did not read has State "" (unknown): a Release of it
// is written blind (its compare-and-set checks the state), and Reconcile
// treats it as not live (a lease the store does not know).
func Step(l api.Lease, ev Event, now time.Time) (api.Lease, []Action, error) {
	switch ev := ev.(type) {
	case Reserve:
		return reserve(l, ev, now)
	case Confirm:
		return confirm(l, ev, now)
	case PrepareFailed:
		return prepareFailed(l, ev, now)
	case Placed:
		return placed(l, ev, now)
	case Unplaceable:
		return unplaceable(l, ev, now)
	case Renew:
		return renew(l, ev, now)
	case Release:
		return release(l, ev, now)
	case TornDown:
		return tornDown(l, now)
	case Expire:
		return expire(l, now)
	case NodeDown:
		return nodeDown(l, ev, now)
	case PartsLost:
		return partsLost(l, ev, now)
	case Interrupted:
		return interrupted(l, ev, now)
	case Reconcile:
		return reconcile(l, ev)
	case Moved:
		return moved(l, ev, now)
	case PartAdopted:
		return partAdopted(l, ev, now)
	case MoveStarted:
		return moveStarted(l, ev, now)
	case MoveDone:
		return moveDone(l, ev, now)
	case MoveFailed:
		return moveFailed(l, ev, now)
	}
	return l, nil, fmt.Errorf("lifecycle: unknown event %T", ev)
}

func reserve(l api.Lease, e Reserve, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseRequested {
		return l, nil, refuse("lease %s is %s; only a requested lease is reserved", l.ID, word(l.State))
	}
	n := l
	n.State, n.UpdatedAt = api.LeaseReserved, now
	ev := api.Event{At: now, Type: "lease." + string(api.LeaseReserved), Subject: l.ID, State: string(api.LeaseReserved),
		Message: "tenant " + l.Tenant + ": " + string(l.Mode) + " " + string(l.Kind) + " " + e.Size + " on " + fmt.Sprint(len(l.Parts)) + " part(s)"}
	return n, []Action{Create{Demand: e.Demand, Idem: e.Idem, Event: ev}, Prepare{}}, nil
}

func confirm(l api.Lease, e Confirm, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseReserved {
		return l, []Action{Teardown{}}, refuse("lease %s became %s while its lenders prepared it", l.ID, word(l.State))
	}
	ch := store.LeaseChange{URIs: e.URIs}
	if len(e.URIs) == 1 {
		ch.URI = e.URIs[0]
	}
	n, w := write(l, states(api.LeaseReserved), api.LeaseActive, ch, fmt.Sprintf("%d lender(s) confirmed", len(e.URIs)), now)
	w.Undo = []Action{Teardown{}} // released or expired while the lenders prepared it
	return n, []Action{w}, nil
}

func prepareFailed(l api.Lease, e PrepareFailed, now time.Time) (api.Lease, []Action, error) {
	// The lenders that did confirm are told to undo their exports.
	if l.State != api.LeaseReserved {
		return l, []Action{Teardown{}}, refuse("lease %s became %s while its lenders prepared it", l.ID, word(l.State))
	}
	if e.Round+1 >= MaxPrepareRounds {
		why := fmt.Sprintf("lenders did not confirm (%s) and no other placement: gave up after %d rounds", joinReasons(e.Failed), e.Round+1)
		n, w := write(l, states(api.LeaseReserved), api.LeaseFailed, store.LeaseChange{Reason: why, Plan: l.Plan}, "", now)
		return n, []Action{Teardown{}, w, Free{}}, nil
	}
	return l, []Action{Teardown{Placement: e.Round + 1}, Place{Skip: e.Failed}}, nil
}

func placed(l api.Lease, e Placed, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseReserved {
		return l, nil, refuse("lease %s is %s; only a reserved lease is placed again", l.ID, word(l.State))
	}
	n := l
	plan := e.Plan
	plan.ID = l.ID
	n.Parts, n.Plan, n.Mode, n.UpdatedAt = slices.Clone(plan.Parts), &plan, plan.Mode, now
	n.NodeID, n.DeviceID = "", ""
	if len(n.Parts) > 0 {
		n.NodeID, n.DeviceID = n.Parts[0].NodeID, n.Parts[0].DeviceID
	}
	ev := api.Event{At: now, Type: "lease.replaced", Subject: l.ID, State: string(api.LeaseReserved),
		Message: fmt.Sprintf("re-placed after %d lender(s) did not confirm", e.Skipped)}
	return n, []Action{Replace{Plan: plan, Event: ev}, Prepare{}}, nil
}

func unplaceable(l api.Lease, e Unplaceable, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseReserved {
		return l, nil, refuse("lease %s is %s; only a reserved lease fails to be placed", l.ID, word(l.State))
	}
	why := fmt.Sprintf("lenders did not confirm (%s) and no other placement: %v", joinReasons(e.Failed), e.Err)
	n, w := write(l, states(api.LeaseReserved), api.LeaseFailed, store.LeaseChange{Reason: why, Plan: e.Plan}, "", now)
	return n, []Action{w, Free{}}, nil
}

func renew(l api.Lease, e Renew, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseReserved && l.State != api.LeaseActive {
		return l, nil, refuse("lease %s is %s; only reserved or active leases renew", l.ID, word(l.State))
	}
	ttl := e.TTLSeconds
	if ttl == 0 {
		ttl = l.TTLSeconds
	}
	exp := now.Add(time.Duration(ttl) * time.Second)
	n, w := write(l, states(l.State), l.State, store.LeaseChange{ExpiresAt: exp, TTL: ttl},
		"renewed until "+exp.Format(time.RFC3339), now)
	return n, []Action{w}, nil
}

func release(l api.Lease, e Release, now time.Time) (api.Lease, []Action, error) {
	switch l.State {
	case "", api.LeaseReserved, api.LeaseActive:
		n, w := write(l, states(api.LeaseReserved, api.LeaseActive), api.LeaseReleasing, store.LeaseChange{Tenant: e.Tenant},
			"released by tenant "+e.By, now)
		return n, []Action{w, Teardown{}}, nil
	case api.LeaseReleasing:
		return l, []Action{Teardown{}}, nil // an interrupted release: finish it
	case api.LeaseReleased:
		return l, nil, nil
	case api.LeaseFailed, api.LeaseLost, api.LeaseExpired:
		return l, nil, refuse("lease %s is already %s (%s)", l.ID, word(l.State), l.Reason)
	}
	return l, nil, refuse("lease %s is %s", l.ID, word(l.State))
}

func tornDown(l api.Lease, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseReleasing {
		return l, nil, refuse("lease %s is %s, not releasing", l.ID, word(l.State))
	}
	n, w := write(l, states(api.LeaseReleasing), api.LeaseReleased, store.LeaseChange{}, "lenders torn down", now)
	return n, []Action{w, Free{}}, nil
}

func expire(l api.Lease, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseReserved && l.State != api.LeaseActive {
		return l, nil, refuse("lease %s is %s; only reserved or active leases expire", l.ID, word(l.State))
	}
	if !l.ExpiresAt.Before(now) {
		return l, nil, refuse("lease %s runs until %s", l.ID, l.ExpiresAt.Format(time.RFC3339))
	}
	reason := fmt.Sprintf("TTL of %ds ran out at %s without renewal", l.TTLSeconds, l.ExpiresAt.Format(time.RFC3339))
	// The write checks the expiry too: a renewal written since l was read
	// wins.
	n, w := write(l, states(api.LeaseReserved, api.LeaseActive), api.LeaseExpired, store.LeaseChange{Reason: reason, ExpiredBy: now}, "", now)
	return n, []Action{w, Free{}, Teardown{}}, nil
}

func nodeDown(l api.Lease, e NodeDown, now time.Time) (api.Lease, []Action, error) {
	switch {
	case l.State != api.LeaseReserved && l.State != api.LeaseActive && l.State != api.LeaseReleasing:
		return l, nil, refuse("lease %s is %s; it holds no devices to lose", l.ID, word(l.State))
	case !onNode(l, e.NodeID):
		return l, nil, refuse("lease %s has no part on node %s", l.ID, e.NodeID)
	}
	reason := fmt.Sprintf("lender node %s (%s) is down", e.Name, e.NodeID)
	if e.Removed {
		reason = fmt.Sprintf("lender node %s (%s) was removed", e.Name, e.NodeID)
	}
	return loseParts(l, func(p api.Part) bool { return p.NodeID == e.NodeID }, e.NodeID, e.Removed, reason, now)
}

func partsLost(l api.Lease, e PartsLost, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseReserved && l.State != api.LeaseActive && l.State != api.LeaseReleasing {
		return l, nil, refuse("lease %s is %s; it holds no devices to lose", l.ID, word(l.State))
	}
	pick := func(p api.Part) bool {
		return p.NodeID == e.NodeID && slices.ContainsFunc(e.Parts, func(r api.PartRef) bool {
			return r.DeviceID == p.DeviceID && r.Offset == p.Offset
		})
	}
	if !slices.ContainsFunc(l.Parts, func(p api.Part) bool { return pick(p) && !p.Lost() }) {
		return l, nil, refuse("lease %s has no such part on node %s", l.ID, e.NodeID)
	}
	reason := fmt.Sprintf("lender node %s lost the part's export: %s", e.NodeID, e.Why)
	return loseParts(l, pick, e.NodeID, false, reason, now)
}

// loseParts loses the parts of l that pick selects (on node nodeID, for
// reason; removed: the node was removed): a lease that Degrades goes on
// without them while others are left; any other lease is lost.
func loseParts(l api.Lease, pick func(api.Part) bool, nodeID string, removed bool, reason string, now time.Time) (api.Lease, []Action, error) {
	var lost []int
	left, before := 0, 0
	for i, p := range l.Parts {
		switch {
		case p.Lost():
			before++
		case pick(p):
			lost = append(lost, i)
		default:
			left++
		}
	}
	if l.State == api.LeaseActive && Degrades(l) && left > 0 {
		// The lease goes on without the node's parts: the other lenders
		// keep serving theirs, the borrower drops the lost ones.
		n, w := write(l, states(api.LeaseActive), api.LeaseActive, store.LeaseChange{LostParts: lost}, "", now)
		w.Event.Type = "lease.part.lost"
		w.Event.Message = fmt.Sprintf("part(s) %s lost: %s; the lease goes on with %d of %d part(s)", joinInts(lost), reason, left, len(l.Parts))
		return n, []Action{w, FreeParts{Parts: lost}}, nil
	}
	if before > 0 {
		reason += fmt.Sprintf("; %d other part(s) were lost before", before)
	}
	n, w := write(l, states(api.LeaseReserved, api.LeaseActive, api.LeaseReleasing), api.LeaseLost, store.LeaseChange{Reason: reason}, "", now)
	return n, []Action{w, Free{}, Teardown{Except: nodeID, Removed: removed}}, nil // the other lenders of a composed lease
}

// Degrades reports whether lease l may lose a part and go on with the
// others: a NIC bond (a composed nic lease), whose bandwidth adds over its
// lenders, and whose borrower drops a lost lender's share (docs/nic.md).
// A composed block or memory volume stripes its data over every part, so
// it cannot; nor a dedicated accelerator lease of several slots, whose
// borrower addresses each slot by its index.
func Degrades(l api.Lease) bool {
	return l.Kind == api.KindNIC && l.Mode == api.ModeComposed && len(l.Parts) > 1
}

// joinInts is a list of part indexes in an event.
func joinInts(is []int) string {
	s := make([]string, len(is))
	for k, i := range is {
		s[k] = fmt.Sprint(i)
	}
	return strings.Join(s, ", ")
}

func interrupted(l api.Lease, e Interrupted, now time.Time) (api.Lease, []Action, error) {
	var to api.LeaseState
	var reason string
	switch l.State {
	case api.LeaseReleasing:
		to, reason = api.LeaseReleased, "release completed after an interruption"
	case api.LeaseReserved:
		to, reason = api.LeaseFailed, "reservation was never confirmed (interrupted)"
	default:
		return l, nil, refuse("lease %s is %s; only reservations and releases are interrupted", l.ID, word(l.State))
	}
	if !l.UpdatedAt.Before(e.Before) {
		return l, nil, refuse("lease %s changed at %s, not before %s", l.ID, l.UpdatedAt.Format(time.RFC3339Nano), e.Before.Format(time.RFC3339Nano))
	}
	n, w := write(l, states(l.State), to, store.LeaseChange{Reason: reason}, "", now)
	// Torn down once written: a reservation whose pipeline (slow, or on
	// another replica) confirms it meanwhile stays active and served.
	return n, []Action{w, Teardown{}, Free{}}, nil
}

func reconcile(l api.Lease, e Reconcile) (api.Lease, []Action, error) {
	if l.State == api.LeaseReserved || l.State == api.LeaseActive {
		var keep []api.PartRef
		for _, p := range l.Parts {
			if p.NodeID == e.NodeID && !p.Lost() {
				keep = append(keep, api.PartRef{DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
			}
		}
		var doubt []api.PartRef
		if l.State == api.LeaseActive {
			keep = append(keep, e.Incoming...)
			doubt = e.Doubt
		}
		if len(keep) > 0 {
			return l, []Action{KeepOn{NodeID: e.NodeID, ExpiresAt: l.ExpiresAt, Parts: keep, Doubt: doubt}}, nil
		}
		if len(doubt) > 0 {
			return l, nil, nil // the node's exports of it are left as they are
		}
	}
	return l, []Action{TeardownOn{NodeID: e.NodeID}}, nil // the reporting node stops serving it
}

func moved(l api.Lease, e Moved, now time.Time) (api.Lease, []Action, error) {
	if l.State != api.LeaseActive {
		return l, nil, refuse("lease %s is %s; only an active lease's exports move", l.ID, word(l.State))
	}
	uris := make([]string, len(l.Parts))
	for i, p := range l.Parts {
		uris[i] = p.URI
	}
	changed := false
	for _, m := range e.Exports {
		i := slices.IndexFunc(l.Parts, func(p api.Part) bool {
			return p.NodeID == e.NodeID && p.DeviceID == m.DeviceID && p.Offset == m.Offset && !p.Lost()
		})
		if (m.LeaseID != "" && m.LeaseID != l.ID) || i < 0 || !sameExport(uris[i], m.URI) {
			return l, nil, fmt.Errorf("%w: lender %s moved an export that is not a part of lease %s it serves", ErrBadReport, e.NodeID, l.ID)
		}
		if uris[i] != m.URI {
			uris[i], changed = m.URI, true
		}
	}
	if !changed {
		return l, nil, nil
	}
	ch := store.LeaseChange{URIs: uris}
	if len(uris) == 1 {
		ch.URI = uris[0]
	}
	n, w := write(l, states(api.LeaseActive), api.LeaseActive, ch, "lender "+e.NodeID+" serves the lease at a new address after a restart", now)
	w.Event.Type = "lease.moved"
	return n, []Action{w}, nil
}

// write returns l moved to state to by ch, as the store applies it, and
// the Persist that writes it: a compare-and-set from the states in from,
// with the audit event "lease.<to>" saying msg (ch.Reason when msg is
// empty).
func write(l api.Lease, from []api.LeaseState, to api.LeaseState, ch store.LeaseChange, msg string, now time.Time) (api.Lease, Persist) {
	ch.From, ch.To, ch.At = from, to, now
	if msg == "" {
		msg = ch.Reason
	}
	n := l
	n.State, n.UpdatedAt = to, now
	if ch.Reason != "" {
		n.Reason = ch.Reason
	}
	if ch.URI != "" {
		n.URI = ch.URI
	}
	if !ch.ExpiresAt.IsZero() {
		n.ExpiresAt = ch.ExpiresAt
	}
	if ch.TTL != 0 {
		n.TTLSeconds = ch.TTL
	}
	if ch.Plan != nil {
		n.Plan = ch.Plan
	}
	if len(ch.URIs) > 0 && len(ch.URIs) <= len(l.Parts) {
		n.Parts = slices.Clone(l.Parts)
		for i, u := range ch.URIs {
			n.Parts[i].URI = u
		}
	}
	if len(ch.LostParts) > 0 {
		n.Parts = slices.Clone(n.Parts)
		for _, i := range ch.LostParts {
			n.Parts[i].State = api.PartLost
		}
	}
	return n, Persist{Change: ch, Event: api.Event{At: now, Type: "lease." + string(to), Subject: l.ID, Message: msg, State: string(to)}}
}

// states is its arguments, as a write's From.
func states(s ...api.LeaseState) []api.LeaseState { return s }

// onNode reports whether a part of l that is not lost is on node id.
func onNode(l api.Lease, id string) bool {
	for _, p := range l.Parts {
		if p.NodeID == id && !p.Lost() {
			return true
		}
	}
	return false
}

// joinReasons lists the whys of node ID → why, sorted by node: each why
// names its lender ("lender node2 refused the part: …").
func joinReasons(m map[string]string) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(m[k])
	}
	return b.String()
}

// plainScheme is a data plane's plaintext scheme for its TLS one.
func plainScheme(s string) string {
	switch s {
	case "nbds", "rialto-mems", "rialto-accels", "rialto-nics":
		return strings.TrimSuffix(s, "s")
	}
	return s
}

// maxURI bounds a reported URI.
const maxURI = 4096

// sameExport reports whether next names the same export as prev (same
// protocol, export name — the URI's path, the lease's secret — and query
// keys, and for an accel gateway the same role) at some other address. A
// protocol's plaintext and TLS schemes (nbd and nbds, rialto-mem and
// rialto-mems, rialto-accel and rialto-accels, rialto-nic and
// rialto-nics) are the same protocol: a lender restarted with or without
// --insecure-dataplane serves the export under the other one.
func sameExport(prev, next string) bool {
	p, n, ok := servedURIs(prev, next)
	return ok && n.EscapedPath() == p.EscapedPath()
}

// AdoptableURI reports whether next may be where another lender serves,
// after a move, the export of a part whose URI is prev: what sameExport
// checks, the path (the export's name, which a move changes) aside. The
// control plane adopts a part at such a URI only (PartAdopted).
func AdoptableURI(prev, next string) bool {
	_, _, ok := servedURIs(prev, next)
	return ok
}

// servedURIs parses prev and next, and reports whether next is a URI an
// export of prev's may be served at: the same protocol (plaintext or
// TLS), a host, no user information or fragment, the same query keys and
// accel gateway.
func servedURIs(prev, next string) (*url.URL, *url.URL, bool) {
	if len(next) > maxURI || prev == "" {
		return nil, nil, false
	}
	p, err1 := url.Parse(prev)
	n, err2 := url.Parse(next)
	if err1 != nil || err2 != nil || n.Host == "" || n.User != nil || n.Fragment != "" ||
		plainScheme(n.Scheme) != plainScheme(p.Scheme) {
		return nil, nil, false
	}
	pq, nq := p.Query(), n.Query()
	if len(pq) != len(nq) || pq.Get("gateway") != nq.Get("gateway") {
		return nil, nil, false
	}
	for k := range pq {
		if _, ok := nq[k]; !ok {
			return nil, nil, false
		}
	}
	return p, n, true
}
