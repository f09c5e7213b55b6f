package lifecycle

import (
	"fmt"
	"slices"
	"time"

	"github.com/rialto-project/rialto/api"
)

// Moving a part of an active lease to another lender while it is used
// (docs/operations.md, "Moving leases and draining nodes"). The lease stays
// active throughout: a move is not a state of the lease but a record of
// its own (store.Mover), opened by MoveStarted, committed by MoveDone (the
// lease points at the destination from then on) and closed by MoveDone's
// EndMove or by MoveFailed.

// where is a part's place, for events (no URI: it is a secret).
func where(p api.Part) string {
	return fmt.Sprintf("node %s device %s [%d+%d]", p.NodeID, p.DeviceID, p.Offset, p.Length)
}

// source returns part m.Part of lease l, which l has, for move or
// adoption m: refused if the part was lost (lost says what it then is
// not), is not where m starts from, or is not as long as m's destination
// (dest names it).
func source(l api.Lease, m api.Move, lost, dest string) (api.Part, error) {
	p := l.Parts[m.Part]
	if p.Lost() {
		return p, refuse("lease %s part %d was lost; %s", l.ID, m.Part, lost)
	}
	if p.NodeID != m.From.NodeID || p.DeviceID != m.From.DeviceID || p.Offset != m.From.Offset || p.Length != m.From.Length {
		return p, refuse("lease %s part %d is not at %s", l.ID, m.Part, where(m.From))
	}
	if m.To.Length != p.Length {
		return p, refuse("lease %s part %d is %d long; %s is %d", l.ID, m.Part, p.Length, dest, m.To.Length)
	}
	return p, nil
}

// withPart is lease l with to, at uri, as its part i (and uri as its URI
// where i is its only part), updated at now.
func withPart(l api.Lease, i int, to api.Part, uri string, now time.Time) api.Lease {
	n := l
	n.Parts = slices.Clone(l.Parts)
	n.Parts[i] = api.Part{NodeID: to.NodeID, DeviceID: to.DeviceID, Offset: to.Offset, Length: to.Length, URI: uri}
	if len(n.Parts) == 1 {
		n.URI = uri
	}
	n.NodeID, n.DeviceID = n.Parts[0].NodeID, n.Parts[0].DeviceID
	n.UpdatedAt = now
	return n
}

func moveStarted(l api.Lease, e MoveStarted, now time.Time) (api.Lease, []Action, error) {
	m := e.Move
	switch {
	case l.State != api.LeaseActive:
		return l, nil, refuse("lease %s is %s; only an active lease moves", l.ID, word(l.State))
	case m.Part < 0 || m.Part >= len(l.Parts):
		return l, nil, refuse("lease %s has %d part(s), not a part %d", l.ID, len(l.Parts), m.Part)
	case l.Kind != api.KindBlock && l.Kind != api.KindMemory && l.Kind != api.KindAccel:
		return l, nil, refuse("lease %s is %s %s lease; block, memory and accelerator leases move", l.ID, l.Kind.Article(), l.Kind)
	}
	p, err := source(l, m, "it does not move", "its destination")
	if err != nil {
		return l, nil, err
	}
	if m.To.DeviceID == p.DeviceID && m.To.Offset < p.Offset+p.Length && p.Offset < m.To.Offset+m.To.Length {
		return l, nil, refuse("lease %s part %d's destination overlaps it", l.ID, m.Part)
	}
	msg := fmt.Sprintf("part %d moving from %s to %s", m.Part, where(m.From), where(m.To))
	if m.Reason != "" {
		msg += " (" + m.Reason + ")"
	}
	ev := api.Event{At: now, Type: "lease.move.started", Subject: l.ID, Message: msg, State: string(l.State)}
	return l, []Action{BeginMove{Move: m, Event: ev}}, nil
}

func moveDone(l api.Lease, e MoveDone, now time.Time) (api.Lease, []Action, error) {
	m := e.Move
	if l.State != api.LeaseActive {
		// Released, expired or lost while it moved: the move ends, both
		// lenders undo it.
		return l, []Action{AbortMove{Move: m}, endMove(l, m, api.MoveFailed, "the lease became "+word(l.State)+" while it moved", now)},
			refuse("lease %s became %s while part %d moved", l.ID, word(l.State), m.Part)
	}
	if m.Part < 0 || m.Part >= len(l.Parts) {
		return l, []Action{AbortMove{Move: m}, endMove(l, m, api.MoveFailed, "the lease has no such part", now)},
			refuse("lease %s has %d part(s), not a part %d", l.ID, len(l.Parts), m.Part)
	}
	n := withPart(l, m.Part, m.To, e.URI, now)
	ev := api.Event{At: now, Type: "lease.moved", Subject: l.ID, State: string(l.State),
		Message: fmt.Sprintf("part %d moved from %s to %s; its URI changed (borrowers through rialto attach follow it)", m.Part, where(m.From), where(m.To))}
	fin := FinishMove{Move: m, URI: e.URI, Event: ev,
		Undo: []Action{AbortMove{Move: m}, endMove(l, m, api.MoveFailed, "the lease could not be pointed at the destination", now)}}
	return n, []Action{fin}, nil
}

func partAdopted(l api.Lease, e PartAdopted, now time.Time) (api.Lease, []Action, error) {
	m := e.Move
	switch {
	case l.State != api.LeaseActive:
		return l, nil, refuse("lease %s is %s; only an active lease's part is adopted", l.ID, word(l.State))
	case m.Part < 0 || m.Part >= len(l.Parts):
		return l, nil, refuse("lease %s has %d part(s), not a part %d", l.ID, len(l.Parts), m.Part)
	case e.URI == "":
		return l, nil, refuse("lease %s part %d: the adopted export has no URI", l.ID, m.Part)
	}
	p, err := source(l, m, "it is not adopted", "the export adopted")
	if err != nil {
		return l, nil, err
	}
	if !AdoptableURI(p.URI, e.URI) {
		return l, nil, fmt.Errorf("%w: lender %s serves part %d of lease %s at a URI its borrower is not to be sent to", ErrBadReport, m.To.NodeID, m.Part, l.ID)
	}
	n := withPart(l, m.Part, m.To, e.URI, now)
	msg := fmt.Sprintf("part %d adopted at %s, which serves it: its recorded lender node %s does not (the control plane's database restored from a backup taken before the part moved to node %s?); the part's URI is the one node %s serves it at",
		m.Part, where(m.To), m.From.NodeID, m.To.NodeID, m.To.NodeID)
	ev := api.Event{At: now, Type: "lease.part.adopted", Subject: l.ID, State: string(l.State), Message: msg}
	return n, []Action{AdoptPart{Move: m, URI: e.URI, Event: ev}}, nil
}

func moveFailed(l api.Lease, e MoveFailed, now time.Time) (api.Lease, []Action, error) {
	return l, []Action{endMove(l, e.Move, api.MoveFailed, e.Why, now)}, nil
}

// endMove is the EndMove of move m of lease l, with its event.
func endMove(l api.Lease, m api.Move, state, why string, now time.Time) EndMove {
	ev := api.Event{At: now, Type: "lease.move.done", Subject: l.ID, State: string(l.State),
		Message: fmt.Sprintf("part %d moved to %s", m.Part, where(m.To))}
	if state == api.MoveFailed {
		ev.Type = "lease.move.failed"
		ev.Message = fmt.Sprintf("part %d stays at %s: %s", m.Part, where(m.From), why)
	}
	return EndMove{Move: m, State: state, Error: why, Event: ev}
}

// MoveEnded returns the EndMove of a move that ended as state (done, or
// failed because of why), for the caller to perform: the end of a
// committed move is not a step of the lease.
func MoveEnded(l api.Lease, m api.Move, state, why string, now time.Time) EndMove {
	return endMove(l, m, state, why, now)
}
