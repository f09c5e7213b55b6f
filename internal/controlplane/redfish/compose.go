package redfish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/rialto-project/rialto/api"
)

// maxBody bounds a request body.
const maxBody = 1 << 20

// decodeBody decodes a JSON body strictly into v.
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return errBadRequest("MalformedJSON", "reading the body: "+err.Error())
	}
	if len(b) > maxBody {
		return errBadRequest("MalformedJSON", fmt.Sprintf("the body is over %d bytes", maxBody))
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return errBadRequest("MalformedJSON", "the body is empty; a JSON object is required")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errBadRequest("MalformedJSON", "the body is not the JSON expected: "+err.Error())
	}
	if dec.More() {
		return errBadRequest("MalformedJSON", "trailing data after the JSON object")
	}
	return nil
}

// readObject reads a JSON object body (not strict: Redfish bodies carry
// annotations).
func readObject(r *http.Request) (obj, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(b) > maxBody {
		return nil, errBadRequest("MalformedJSON", "the body is unreadable or over 1 MiB")
	}
	var o obj
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&o); err != nil || o == nil {
		return nil, errBadRequest("MalformedJSON", "the body must be a JSON object")
	}
	return o, nil
}

// systemRequest turns a ComputerSystem create body into a lease request:
//
//   - Specific composition: Links.ResourceBlocks names resource blocks
//     (devices, all of one kind) that the lease is pinned to; without a
//     capacity, a single block is taken whole, several are composed
//     (striped) with as much as the freest of them has.
//   - Constrained composition: capacities, under Storage or SimpleStorage
//     (objects with CapacityBytes: drives), Memory (CapacityMiB) or
//     Processors (ProcessorType Accelerator or FPGA), each multiplied by
//     its @Redfish.RequestedCount; Links.ResourceBlocks may name a
//     resource zone to fix the kind. Several drives make a composed
//     (striped) volume of their total size.
//
// Oem.Rialto, if present, is an api.LeaseRequest fragment applied last
// (ttl_seconds, mode, stripe_unit, role, bandwidth, …).
func systemRequest(o obj, v *view) (api.LeaseRequest, error) {
	var req api.LeaseRequest
	if at, ok := o["@Redfish.OperationApplyTime"]; ok && at != "Immediate" {
		return req, errBadRequest("PropertyValueNotInList", fmt.Sprintf("@Redfish.OperationApplyTime %v is not supported: composition is Immediate; use the Compose action's Preview and PreviewReserve to look before composing", at))
	}
	if name, ok := o["Name"].(string); ok {
		if len(name) > 256 {
			return req, errBadRequest("PropertyValueFormatError", "Name is longer than 256 bytes")
		}
		req.Borrower = name
	}
	var kinds []api.Kind
	var pins []api.Device
	if lk, ok := o["Links"].(obj); ok {
		rbs, _ := lk["ResourceBlocks"].([]any)
		for _, x := range rbs {
			m, _ := x.(obj)
			id, _ := m["@odata.id"].(string)
			id = strings.TrimRight(id, "/")
			switch {
			case strings.HasPrefix(id, pBlocks+"/"):
				d, ok := v.device(strings.TrimPrefix(id, pBlocks+"/"))
				if !ok {
					return req, errBadRequest("ResourceMissingAtURI", "no resource block at "+id)
				}
				pins = append(pins, d)
				kinds = append(kinds, d.Kind)
			case strings.HasPrefix(id, pZones+"/"):
				k := api.Kind(strings.TrimPrefix(id, pZones+"/"))
				if zonesOf(k) == nil {
					return req, errBadRequest("ResourceMissingAtURI", "no resource zone at "+id)
				}
				kinds = append(kinds, k)
			default:
				return req, errBadRequest("PropertyValueIncorrect", fmt.Sprintf("Links.ResourceBlocks entry %q is neither a resource block nor a resource zone", id))
			}
		}
	}
	var drives, driveBytes, memMiB, procs int64
	var role string
	for _, key := range []string{"Storage", "SimpleStorage"} {
		if x, ok := o[key]; ok {
			walk(x, 1, func(m obj, n int64) {
				if c, ok := number(m["CapacityBytes"]); ok {
					drives += n
					driveBytes += c * n
				}
			})
			kinds = append(kinds, api.KindBlock)
		}
	}
	if x, ok := o["Memory"]; ok {
		walk(x, 1, func(m obj, n int64) {
			if c, ok := number(m["CapacityMiB"]); ok {
				memMiB += c * n
			}
		})
		kinds = append(kinds, api.KindMemory)
	}
	if x, ok := o["Processors"]; ok {
		walk(x, 1, func(m obj, n int64) {
			switch m["ProcessorType"] {
			case "Accelerator", "FPGA":
				procs += n
				if md, ok := m["Model"].(string); ok && role == "" {
					role = md
				}
			}
		})
		kinds = append(kinds, api.KindAccel)
	}
	for _, k := range kinds {
		if k != kinds[0] {
			return req, errBadRequest("PropertyValueConflict", fmt.Sprintf("a composed system is one Rialto lease, of one kind; this request mixes %s and %s: compose one system per kind", kinds[0], k))
		}
	}
	if len(kinds) == 0 {
		return req, errBadRequest("PropertyMissing", "name resource blocks (Links.ResourceBlocks: specific composition) or capacities (Storage, SimpleStorage, Memory or Processors: constrained composition)")
	}
	req.Kind = kinds[0]
	for _, d := range pins {
		req.Affinity = append(req.Affinity, d.ID)
	}
	switch req.Kind {
	case api.KindBlock:
		switch {
		case driveBytes > 0:
			req.Size = driveBytes
			req.Count = int(max(drives, int64(len(pins))))
		case len(pins) == 1:
			req.Whole = true
		case len(pins) > 1:
			free := pins[0].Capacity - pins[0].Allocated
			for _, d := range pins {
				if d.Capacity-d.Allocated <= 0 {
					return req, &rfError{status: http.StatusConflict, id: "ResourceInUse", msg: "resource block " + d.ID + " (" + d.Name + ") is in use: no free capacity"}
				}
				free = min(free, d.Capacity-d.Allocated)
			}
			req.Count = len(pins)
			req.Size = (free >> 20 << 20) * int64(len(pins))
		default:
			return req, errBadRequest("PropertyMissing", "a storage request needs CapacityBytes")
		}
		if req.Count > 1 {
			req.Mode = api.ModeComposed
		}
	case api.KindMemory:
		if memMiB > 0 {
			req.Size = memMiB << 20
		} else if len(pins) == 1 {
			req.Whole = true
		} else {
			return req, errBadRequest("PropertyMissing", "a memory request needs CapacityMiB (or one resource block)")
		}
	case api.KindAccel:
		req.Count = int(max(procs, int64(len(pins))))
		req.Role = role
	}
	if oem, ok := o["Oem"].(obj); ok {
		if ro, ok := oem["Rialto"]; ok {
			b, _ := json.Marshal(ro)
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				return req, errBadRequest("PropertyValueFormatError", "Oem.Rialto must be fields of a Rialto lease request (docs/api.md): "+err.Error())
			}
		}
	}
	return req, nil
}

// walk calls f for every object under x with the product of the
// @Redfish.RequestedCount annotations on the way (default 1 each).
func walk(x any, n int64, f func(obj, int64)) {
	switch t := x.(type) {
	case obj:
		if c, ok := number(t["@Redfish.RequestedCount"]); ok && c > 0 {
			n *= c
		}
		f(t, n)
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			walk(t[k], n, f)
		}
	case []any:
		for _, e := range t {
			walk(e, n, f)
		}
	}
}

func number(x any) (int64, bool) {
	switch t := x.(type) {
	case json.Number:
		n, err := t.Int64()
		if err != nil {
			f, ferr := t.Float64()
			if ferr != nil {
				return 0, false
			}
			n = int64(f)
		}
		return n, n >= 0
	case float64:
		return int64(t), t >= 0
	}
	return 0, false
}

// composeSystem serves POST /redfish/v1/Systems.
func (s *Service) composeSystem(w http.ResponseWriter, r *http.Request, c *caller) {
	o, err := readObject(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	v, err := s.load(ctx, c, false)
	if err != nil {
		writeError(w, err)
		return
	}
	req, err := systemRequest(o, v)
	if err != nil {
		writeError(w, err)
		return
	}
	req.IdempotencyKey = r.Header.Get("Idempotency-Key")
	l, err := c.c.CreateLease(ctx, req)
	if err != nil {
		writeError(w, err)
		return
	}
	sys, _ := composedTree(l, nil, systemPath(l.ID))
	w.Header().Set("Location", systemPath(l.ID))
	writeJSON(w, nil, http.StatusCreated, sys, "")
}

// decompose serves DELETE /redfish/v1/Systems/{id}: the lease is
// released. If-Match, if given, must match the system's ETag.
func (s *Service) decompose(w http.ResponseWriter, r *http.Request, c *caller, id string) {
	ctx := r.Context()
	v, err := s.load(ctx, c, true)
	if err != nil {
		writeError(w, err)
		return
	}
	if _, ok := v.node(id); ok {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, &rfError{status: http.StatusMethodNotAllowed, id: "ResourceCannotBeDeleted", msg: "a physical system (a node) cannot be deleted; only composed systems decompose"})
		return
	}
	l, ok := v.lease(id)
	if !ok || s.reserved(id) {
		writeError(w, errNotFound(systemPath(id)))
		return
	}
	if im := r.Header.Get("If-Match"); im != "" {
		sys, _ := composedTree(l, nil, systemPath(id))
		b, _ := json.Marshal(sys)
		if !matchETag(im, etag(b)) {
			writeError(w, &rfError{status: http.StatusPreconditionFailed, id: "PreconditionFailed", msg: "the system changed since it was read (If-Match does not match its ETag)"})
			return
		}
	}
	if _, err := c.c.ReleaseLease(ctx, id); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(http.StatusNoContent)
}

// composeRequest is the Compose action's body.
type composeRequest struct {
	RequestFormat string          `json:"RequestFormat"`
	RequestType   string          `json:"RequestType"`
	ReservationID string          `json:"ReservationId"`
	Manifest      json.RawMessage `json:"Manifest"`
}

type manifest struct {
	Description string   `json:"Description,omitempty"`
	Expand      string   `json:"Expand,omitempty"`
	Timestamp   string   `json:"Timestamp,omitempty"`
	Stanzas     []stanza `json:"Stanzas"`
}

type stanza struct {
	StanzaType string `json:"StanzaType"`
	StanzaID   string `json:"StanzaId,omitempty"`
	Request    obj    `json:"Request,omitempty"`
	Response   obj    `json:"Response,omitempty"`
	Oem        obj    `json:"Oem,omitempty"`
}

// composeAction serves the CompositionService.Compose action: Preview
// (explain: the blocks a system would get, nothing held), PreviewReserve
// (a lease held for ReservationDuration, answered with its ReservationId)
// and Apply (compose the manifest's systems, or a reservation's).
func (s *Service) composeAction(w http.ResponseWriter, r *http.Request, c *caller) {
	var cr composeRequest
	if err := decodeBody(r, &cr); err != nil {
		writeError(w, err)
		return
	}
	if cr.RequestFormat != "Manifest" {
		writeError(w, errBadRequest("ActionParameterNotSupported", fmt.Sprintf("RequestFormat %q: only Manifest is supported", cr.RequestFormat)))
		return
	}
	ctx := r.Context()
	switch cr.RequestType {
	case "Apply":
		if cr.ReservationID != "" {
			s.applyReservation(w, r, c, cr.ReservationID)
			return
		}
	case "Preview", "PreviewReserve":
		if cr.ReservationID != "" {
			writeError(w, errBadRequest("ActionParameterNotSupported", "ReservationId goes with RequestType Apply"))
			return
		}
	default:
		writeError(w, errBadRequest("ActionParameterValueNotInList", fmt.Sprintf("RequestType %q is not Preview, PreviewReserve or Apply", cr.RequestType)))
		return
	}
	var m manifest
	if len(cr.Manifest) == 0 {
		writeError(w, errBadRequest("ActionParameterMissing", "Manifest is required (or ReservationId with Apply)"))
		return
	}
	if err := json.Unmarshal(cr.Manifest, &m); err != nil || len(m.Stanzas) == 0 {
		writeError(w, errBadRequest("ActionParameterValueFormatError", "Manifest must hold Stanzas of StanzaType ComposeSystem"))
		return
	}
	v, err := s.load(ctx, c, false)
	if err != nil {
		writeError(w, err)
		return
	}
	reqs := make([]api.LeaseRequest, len(m.Stanzas))
	for i, st := range m.Stanzas {
		if st.StanzaType != "ComposeSystem" {
			writeError(w, errBadRequest("ActionParameterValueNotInList", fmt.Sprintf("stanza %d: StanzaType %q is not ComposeSystem", i, st.StanzaType)))
			return
		}
		raw, _ := json.Marshal(st.Request)
		var o obj
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&o); err != nil || o == nil {
			writeError(w, errBadRequest("ActionParameterMissing", fmt.Sprintf("stanza %d has no Request", i)))
			return
		}
		if reqs[i], err = systemRequest(o, v); err != nil {
			writeError(w, err)
			return
		}
	}
	resp := obj{"RequestFormat": "Manifest", "RequestType": cr.RequestType}
	switch cr.RequestType {
	case "Preview":
		for i, req := range reqs {
			plan, err := c.c.Explain(ctx, req)
			if err != nil {
				writeError(w, err)
				return
			}
			if plan.State != "feasible" {
				writeError(w, &rfError{status: http.StatusConflict, id: "ResourceExhaustion", msg: "stanza " + stanzaName(m.Stanzas[i], i) + " cannot be placed: " + strings.Join(plan.Explanation, "; ")})
				return
			}
			m.Stanzas[i].Response = previewResponse(plan)
		}
	case "PreviewReserve", "Apply":
		var made []api.Lease
		for i, req := range reqs {
			if cr.RequestType == "PreviewReserve" {
				req.TTLSeconds = int64(s.cfg.ReservationDuration / time.Second)
			}
			l, err := c.c.CreateLease(ctx, req)
			if err != nil {
				for _, ml := range made { // all or nothing
					c.c.ReleaseLease(context.WithoutCancel(ctx), ml.ID)
				}
				writeError(w, err)
				return
			}
			made = append(made, l)
			if cr.RequestType == "Apply" {
				m.Stanzas[i].Response = link(systemPath(l.ID))
			} else {
				pl := api.Plan{Mode: l.Mode, Parts: l.Parts, State: "feasible"}
				m.Stanzas[i].Response = previewResponse(pl)
			}
		}
		if cr.RequestType == "PreviewReserve" {
			// One reservation per request, named by its first lease.
			res := &reservation{id: made[0].ID, owner: hashToken(c.token), client: c.user, created: s.cfg.Now(), manifest: cr.Manifest}
			for _, l := range made {
				res.leases = append(res.leases, l.ID)
				res.blocks = append(res.blocks, blockPaths(l)...)
			}
			s.mu.Lock()
			s.reservations[res.id] = res
			s.mu.Unlock()
			resp["ReservationId"] = res.id
		}
	}
	mb, _ := json.Marshal(m)
	resp["Manifest"] = json.RawMessage(mb)
	writeJSON(w, nil, http.StatusOK, resp, "")
}

func stanzaName(st stanza, i int) string {
	if st.StanzaID != "" {
		return st.StanzaID
	}
	return fmt.Sprint(i + 1)
}

// previewResponse is a stanza's answer to a preview: the blocks the system
// would get, and why.
func previewResponse(p api.Plan) obj {
	l := api.Lease{Parts: p.Parts}
	return obj{
		"Links": obj{"ResourceBlocks": links(blockPaths(l))},
		"Oem":   obj{"Rialto": obj{"Mode": string(p.Mode), "Explanation": p.Explanation, "PredictedBandwidth": p.PredictedBandwidth}},
	}
}

// reserved reports whether lease id belongs to a reservation not yet
// applied.
func (s *Service) reserved(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, res := range s.reservations {
		for _, l := range res.leases {
			if l == id {
				return true
			}
		}
	}
	return false
}

// ownReservation returns the caller's reservation id.
func (s *Service) ownReservation(c *caller, id string) (*reservation, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res, ok := s.reservations[id]
	if !ok || res.owner != hashToken(c.token) {
		return nil, false
	}
	return res, true
}

// applyReservation makes a reservation's lease a composed system: it is
// renewed with the system TTL and leaves the reservations.
func (s *Service) applyReservation(w http.ResponseWriter, r *http.Request, c *caller, id string) {
	res, ok := s.ownReservation(c, id)
	if !ok {
		writeError(w, &rfError{status: http.StatusNotFound, id: "ResourceNotFound", msg: "no reservation " + id + " (expired, applied or never made)"})
		return
	}
	var systems []obj
	for _, lid := range res.leases {
		if _, err := c.c.RenewLease(r.Context(), lid, int64(s.cfg.DefaultTTL/time.Second)); err != nil {
			if api.IsCode(err, api.CodeConflict) || api.IsCode(err, api.CodeNotFound) {
				err = &rfError{status: http.StatusConflict, id: "ResourceInUse", msg: "reservation " + id + " has ended (a reservation lasts ReservationDuration): " + err.Error()}
			}
			for _, other := range res.leases { // all or nothing
				c.c.ReleaseLease(context.WithoutCancel(r.Context()), other)
			}
			s.forget(id)
			writeError(w, err)
			return
		}
		systems = append(systems, link(systemPath(lid)))
	}
	s.forget(id)
	var m manifest
	json.Unmarshal(res.manifest, &m)
	for i := range m.Stanzas {
		if i < len(systems) {
			m.Stanzas[i].Response = systems[i]
		}
	}
	if len(m.Stanzas) == 0 {
		m.Stanzas = []stanza{{StanzaType: "ComposeSystem", Response: systems[0]}}
	}
	writeJSON(w, nil, http.StatusOK, obj{"RequestFormat": "Manifest", "RequestType": "Apply", "ReservationId": id, "Manifest": m}, "")
}

func (s *Service) forget(id string) {
	s.mu.Lock()
	delete(s.reservations, id)
	s.mu.Unlock()
}

// reservationCollection lists the caller's pending reservations; those
// whose lease has ended (expired) are forgotten.
func (s *Service) reservationCollection(ctx context.Context, c *caller) (obj, error) {
	live, err := s.liveReservations(ctx, c)
	if err != nil {
		return nil, err
	}
	var ms []string
	for _, res := range live {
		ms = append(ms, pReservations+"/"+res.id)
	}
	return collection(pReservations, "CompositionReservationCollection", "Pending composition reservations", ms), nil
}

func (s *Service) liveReservations(ctx context.Context, c *caller) ([]*reservation, error) {
	h := hashToken(c.token)
	s.mu.Lock()
	var mine []*reservation
	for _, res := range s.reservations {
		if res.owner == h {
			mine = append(mine, res)
		}
	}
	s.mu.Unlock()
	if len(mine) == 0 {
		return nil, nil
	}
	ls, err := c.c.Leases(ctx)
	if err != nil {
		return nil, err
	}
	liveIDs := map[string]bool{}
	for _, l := range ls {
		liveIDs[l.ID] = true
	}
	var out []*reservation
	for _, res := range mine {
		if liveIDs[res.leases[0]] {
			out = append(out, res)
		} else {
			s.forget(res.id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out, nil
}

func (s *Service) reservationResource(ctx context.Context, c *caller, id string) (obj, error) {
	live, err := s.liveReservations(ctx, c)
	if err != nil {
		return nil, err
	}
	for _, res := range live {
		if res.id != id {
			continue
		}
		o := obj{
			"@odata.id":              pReservations + "/" + id,
			"@odata.type":            typeOf("CompositionReservation"),
			"Id":                     id,
			"Name":                   "Reservation " + id,
			"ReservationTime":        res.created.UTC().Format(time.RFC3339),
			"ReservedResourceBlocks": links(res.blocks),
		}
		if res.client != "" {
			o["Client"] = res.client
		}
		if res.manifest != nil {
			o["Manifest"] = res.manifest
		}
		return o, nil
	}
	return nil, errNotFound(pReservations + "/" + id)
}

// deleteReservation gives a reservation's devices back.
func (s *Service) deleteReservation(w http.ResponseWriter, r *http.Request, c *caller, id string) {
	res, ok := s.ownReservation(c, id)
	if !ok {
		writeError(w, errNotFound(pReservations+"/"+id))
		return
	}
	for _, l := range res.leases {
		if _, err := c.c.ReleaseLease(r.Context(), l); err != nil && !api.IsCode(err, api.CodeNotFound) && !errors.Is(err, context.Canceled) {
			writeError(w, err)
			return
		}
	}
	s.forget(id)
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(http.StatusNoContent)
}
