package controlplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/lifecycle"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/placement"
	"github.com/rialto-project/rialto/internal/resource"
)

// This file is the reservation pipeline: the path of POST /v1/leases
// from a validated request to an active lease (docs/ARCHITECTURE.md,
// "The path of a lease request").

const (
	maxPlaceAttempts  = 16 // reservation races lost before giving up
	maxParts          = 64
	maxIdempotencyKey = 200
	idempotencyHeader = "Idempotency-Key"
	// maxLeaseSize bounds a request's size (bytes; slot units for accel;
	// bytes/s for nic): 1 EiB, far above any device, and far enough below
	// the int64 limit that placement's rounding (to alignment, to stripe
	// units, over up to maxParts parts) cannot overflow.
	maxLeaseSize = 1 << 60
	// maxStripeUnit bounds a composed lease's stripe unit (1 TiB).
	maxStripeUnit = 1 << 40
	// maxDeadlineSeconds bounds deadline_seconds (about 31 years), so that
	// it converts to a time.Duration without overflowing.
	maxDeadlineSeconds = 1e9
	// maxLabel bounds a requested label's key and its value (bytes).
	maxLabel = 256
)

// reservation is what a lease request's pipeline keeps between its steps.
type reservation struct {
	tenant string
	req    api.LeaseRequest
	demand store.Demand
	ttl    time.Duration
	now    time.Time
	rounds int               // prepare rounds so far
	failed map[string]string // the lenders that did not confirm in the last round (node ID → why)
	skip   map[string]string // the lenders placed around, for not confirming in a round
	why    map[string]string // every lender that did not confirm, in any round (what a lease that fails to be placed again names)
	// wiping are the parts of the last round that their lenders refused
	// only because they were still wiping the ranges: their lenders are
	// not skipped, the ranges are placed around (wiping.go).
	wiping []api.Part
}

// hold names lease id to the reserver.
func (r *reservation) hold(id string) hold {
	return hold{id: id, tenant: r.tenant, kind: r.req.Kind, demand: r.demand}
}

// lease is the requested lease, placed by plan: the lease state machine
// reserves it.
func (r *reservation) lease(id string, plan api.Plan) api.Lease {
	req := r.req
	count, held := api.Holding(plan.Parts) // the parts placement chose, not the request's count
	l := api.Lease{
		ID: id, State: api.LeaseRequested, Kind: req.Kind, Mode: plan.Mode, Tenant: r.tenant,
		Borrower: req.Borrower, Size: req.Size, Held: held, Count: count, StripeUnit: req.StripeUnit, Parts: plan.Parts,
		BandwidthCap: req.BandwidthCap, IOPSCap: req.IOPSCap,
		Credential: resource.NewSecret("rlc"), TTLSeconds: int64(r.ttl / time.Second), ExpiresAt: r.now.Add(r.ttl),
		CreatedAt: r.now, UpdatedAt: r.now, IdempotencyKey: req.IdempotencyKey, Plan: &plan,
	}
	if l.Mode == api.ModeComposed && l.StripeUnit == 0 && (req.Kind == api.KindBlock || req.Kind == api.KindMemory) {
		l.StripeUnit = defaultStripeUnit
	}
	if req.Kind == api.KindNIC || req.Kind == api.KindAccel {
		// A nic lease's size is the rate its parts hold (a whole
		// interface's is its rate); an accel lease's the slot units its
		// parts hold (a shared lease's: its share).
		l.Size = held
	}
	return l
}

// createLease runs the reservation pipeline: place the request and write
// the reservation (reserve), prepare the exports on the lenders, activate
// on their confirmation; lenders that do not confirm are skipped and the
// lease placed again without them. Each step is the lease state machine's
// (lifecycle.Step, performed by apply); the pipeline performs the actions
// the machine leaves to it (outcome) and feeds their outcomes back, until
// the machine asks for nothing more: the lease is active, or failed.
// created is false for an idempotent replay.
func (s *Server) createLease(ctx context.Context, p principal, req api.LeaseRequest) (l api.Lease, created bool, err error) {
	if err := s.validateLeaseRequest(&req); err != nil {
		return l, false, err
	}
	var idem *store.Idempotency
	if req.IdempotencyKey != "" {
		// A used key is found by the reservation's write, which the store
		// refuses (ErrDuplicate), rather than by a read before placing:
		// that read would cost every keyed creation a round trip to the
		// store (clients of several replicas key every creation: api).
		idem = &store.Idempotency{Tenant: p.tenant, Key: req.IdempotencyKey, RequestHash: requestHash(req)}
	}
	r := &reservation{tenant: p.tenant, req: req, now: s.now(), skip: map[string]string{}, why: map[string]string{},
		ttl: time.Duration(req.TTLSeconds) * time.Second, demand: store.Demand{Bandwidth: req.Bandwidth, Work: req.Work}}
	if r.ttl == 0 {
		r.ttl = s.cfg.DefaultTTL
	}
	if req.DeadlineSecond > 0 {
		r.demand.Deadline = r.now.Add(time.Duration(req.DeadlineSecond * float64(time.Second)))
	}
	r.demand.Gateway = requestGateway(req)
	l, todo, err := s.reserve(ctx, r, idem)
	if err != nil && idem != nil {
		// A retry of a creation that succeeded may also find no room (the
		// first took it) or its tenant at quota: its key's lease answers.
		if l, rerr := s.replay(ctx, idem); !errors.Is(rerr, store.ErrNotFound) || errors.Is(err, store.ErrDuplicate) {
			return l, false, rerr
		}
	}
	if err != nil {
		return l, false, err
	}
	for ev := s.outcome(ctx, r, l, todo); ev != nil; ev = s.outcome(ctx, r, l, todo) {
		prev := l
		l, todo, err = s.apply(ctx, prev, ev)
		if pl, ok := ev.(lifecycle.Placed); ok && err != nil {
			// The store refused the new parts: there is no other placement.
			s.log.Warn("placing a lease again", "lease", prev.ID, "err", err)
			l, todo, err = s.apply(ctx, prev, lifecycle.Unplaceable{Failed: r.why, Err: errors.New(plainText(err)), Plan: &pl.Plan})
		}
		if err != nil {
			// Released, expired or lost while its lenders prepared it
			// (the exports were undone), or the store failed.
			if errors.Is(err, store.ErrConflict) {
				if cur, gerr := s.st.Lease(ctx, l.ID); gerr == nil {
					return cur, true, fmt.Errorf("%w: lease %s became %s while its lenders prepared it", ErrConflict, l.ID, cur.State)
				}
			}
			return api.Lease{}, false, err
		}
	}
	if l.State != api.LeaseActive {
		return l, true, fmt.Errorf("%w: lease %s failed: %s", ErrUnavailable, l.ID, l.Reason)
	}
	return l, true, nil
}

// outcome performs the actions the state machine left to the pipeline —
// prepare the lease on its lenders, or place it again without the lenders
// that did not confirm — and returns their outcome as the next event; nil
// when there is nothing to perform.
func (s *Server) outcome(ctx context.Context, r *reservation, l api.Lease, todo []lifecycle.Action) lifecycle.Event {
	for _, a := range todo {
		switch a := a.(type) {
		case lifecycle.Prepare:
			uris, failed, wiping := s.prepareParts(ctx, l, r.req, r.rounds+1)
			round := r.rounds
			r.rounds++
			if len(failed) == 0 {
				return lifecycle.Confirm{URIs: uris}
			}
			r.failed, r.wiping = failed, wiping // (prepareParts logged each failure)
			return lifecycle.PrepareFailed{Failed: failed, Round: round}
		case lifecycle.Place:
			maps.Copy(r.why, a.Skip)
			for id, why := range a.Skip {
				if !slices.ContainsFunc(r.wiping, func(p api.Part) bool { return p.NodeID == id }) {
					r.skip[id] = why
				}
			}
			for _, p := range r.wiping {
				s.refusedWiping(ctx, l, p) // placed around until the lender's wipes are done
			}
			r.wiping = nil
			plan, err := s.placeOrWait(ctx, r.hold(l.ID), r.req, r.skip)
			if err != nil {
				return lifecycle.Unplaceable{Failed: r.why, Err: errors.New(plainText(err)), Plan: &plan}
			}
			return lifecycle.Placed{Plan: plan, Skipped: len(a.Skip)}
		}
	}
	return nil
}

// reserve places the request and writes the reservation: plan → apply.
// The reserver holds the placed parts in its view until the write's
// outcome is known, so concurrent requests place around them; the write
// is group-committed with other requests' writes, and the store re-checks
// every part atomically, so a stale view costs another placement on fresh
// data, never an over-commit. It returns the reserved lease and what the
// state machine asks for next.
func (s *Server) reserve(ctx context.Context, r *reservation, idem *store.Idempotency) (api.Lease, []lifecycle.Action, error) {
	for attempt := 0; ; attempt++ {
		id := resource.NewID("lease")
		plan, err := s.placeOrWait(ctx, r.hold(id), r.req, nil)
		if err != nil {
			return api.Lease{}, nil, err
		}
		l, todo, err := s.apply(ctx, r.lease(id, plan), lifecycle.Reserve{Demand: r.demand, Idem: idem, Size: sizeText(r.req)})
		switch {
		case err == nil:
			return l, todo, nil
		case (errors.Is(err, store.ErrCapacity) || errors.Is(err, store.ErrQuota)) && attempt < maxPlaceAttempts:
			// Lost a race for a device, or (replicas) another replica's
			// lease of the tenant: place again on fresh data.
			s.m.placeRetries.Inc()
			s.res.Invalidate()
		case errors.Is(err, store.ErrQuota):
			return api.Lease{}, nil, fmt.Errorf("%w: %w", ErrQuota, err)
		case errors.Is(err, store.ErrCapacity):
			return api.Lease{}, nil, fmt.Errorf("%w: devices kept being taken by concurrent leases; try again", ErrUnavailable)
		default:
			return api.Lease{}, nil, err
		}
	}
}

// placeOrWait places req for h (Place). When there is no room while ranges
// released before are still being wiped, it waits until a lender confirms
// a wipe and places again, within ctx and Config.WipeWait: the wiped range
// may be the room the request lacked.
func (s *Server) placeOrWait(ctx context.Context, h hold, req api.LeaseRequest, skip map[string]string) (api.Plan, error) {
	var wctx context.Context
	for {
		wiped, wiping := s.res.wipesPending(ctx)
		plan, err := s.res.Place(ctx, h, req, skip, s.now())
		if err == nil || !wiping || !errors.Is(err, ErrInfeasible) || !s.res.roomAfterWipes(ctx, h, req, skip, s.now()) {
			return plan, err
		}
		if wctx == nil {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, s.cfg.WipeWait)
			defer cancel()
		}
		if !s.waitWipes(wctx, wiped) {
			return plan, fmt.Errorf("%w (a range that would fit is still being wiped after an earlier lease)", err)
		}
	}
}

// explainLease places a tenant's request without reserving anything.
func (s *Server) explainLease(ctx context.Context, tenant string, req api.LeaseRequest) (api.Plan, error) {
	if err := s.validateLeaseRequest(&req); err != nil {
		return api.Plan{}, err
	}
	plan, err := s.res.Preview(ctx, req, tenant, s.now())
	if errors.Is(err, ErrInfeasible) || errors.Is(err, ErrQuota) {
		return plan, nil // a dry run reports infeasibility in the plan
	}
	return plan, err
}

// validateLeaseRequest checks a request and fills defaults.
func (s *Server) validateLeaseRequest(r *api.LeaseRequest) error {
	switch {
	case r.Kind == "":
		return fmt.Errorf("%w: kind is required (%s)", ErrInvalid, api.KindNames())
	case !r.Kind.Valid():
		return fmt.Errorf("%w: unknown kind %q (%s)", ErrInvalid, r.Kind, api.KindNames())
	}
	switch r.Mode {
	case "", api.ModeDedicated, api.ModeShared, api.ModeComposed:
	default:
		return fmt.Errorf("%w: unknown mode %q (dedicated, shared or composed)", ErrInvalid, r.Mode)
	}
	switch r.Strategy {
	case "", "binpack", "spread":
	default:
		return fmt.Errorf("%w: unknown strategy %q (binpack or spread)", ErrInvalid, r.Strategy)
	}
	if r.Size < 0 || r.Count < 0 || r.StripeUnit < 0 || r.TTLSeconds < 0 || r.Bandwidth < 0 || r.MaxLatencyUs < 0 || r.Work < 0 || r.DeadlineSecond < 0 ||
		r.BandwidthCap < 0 || r.IOPSCap < 0 {
		return fmt.Errorf("%w: sizes, counts, durations and rates must not be negative", ErrInvalid)
	}
	if r.Size > maxLeaseSize {
		return fmt.Errorf("%w: size %d is more than the maximum %d", ErrInvalid, r.Size, int64(maxLeaseSize))
	}
	if r.StripeUnit > maxStripeUnit {
		return fmt.Errorf("%w: stripe_unit %d is more than the maximum %d", ErrInvalid, r.StripeUnit, int64(maxStripeUnit))
	}
	if r.DeadlineSecond > maxDeadlineSeconds {
		return fmt.Errorf("%w: deadline_seconds %g is more than the maximum %g", ErrInvalid, r.DeadlineSecond, float64(maxDeadlineSeconds))
	}
	if (r.BandwidthCap > 0 || r.IOPSCap > 0) && r.Kind != api.KindBlock {
		return fmt.Errorf("%w: bandwidth_cap and iops_cap apply to block leases only", ErrInvalid)
	}
	if r.Count > maxParts {
		return fmt.Errorf("%w: count %d is more than %d", ErrInvalid, r.Count, maxParts)
	}
	if r.Mode == api.ModeComposed && r.Count == 1 {
		return fmt.Errorf("%w: a composed lease needs count ≥ 2", ErrInvalid)
	}
	if r.StripeUnit > 0 && r.StripeUnit&(r.StripeUnit-1) != 0 {
		return fmt.Errorf("%w: stripe_unit must be a power of two", ErrInvalid)
	}
	if max := int64(s.cfg.MaxTTL / time.Second); r.TTLSeconds > max {
		return fmt.Errorf("%w: ttl_seconds %d is more than the maximum %d", ErrInvalid, r.TTLSeconds, max)
	}
	if len(r.IdempotencyKey) > maxIdempotencyKey {
		return fmt.Errorf("%w: idempotency key longer than %d bytes", ErrInvalid, maxIdempotencyKey)
	}
	if len(r.Borrower) > 256 || len(r.Role) > 256 || len(r.Affinity) > 64 || len(r.AntiAffinity) > 64 || len(r.Labels) > 64 {
		return fmt.Errorf("%w: borrower, role, affinities or labels too long", ErrInvalid)
	}
	for k, v := range r.Labels {
		if k == "" || len(k) > maxLabel || len(v) > maxLabel {
			return fmt.Errorf("%w: a label's key must be 1 to %d bytes and its value at most %d", ErrInvalid, maxLabel, maxLabel)
		}
	}
	for _, a := range slices.Concat(r.Affinity, r.AntiAffinity) {
		if len(a) > 2*maxLabel+1 { // a node ID or name, or key=value
			return fmt.Errorf("%w: an affinity or anti-affinity term is at most %d bytes", ErrInvalid, 2*maxLabel+1)
		}
	}
	if err := validateNICRequest(r); err != nil {
		return err
	}
	return validateAccelRequest(r)
}

// validateNICRequest checks a lent-NIC request (docs/nic.md) and gives it
// its size: a nic lease is sized by its bandwidth, the rate in bytes/s its
// lenders cap it at (the lease's size is that rate). Without a bandwidth
// it is a whole interface, dedicated; dedicated means a whole interface
// (of at least the bandwidth); count ≥ 2 bonds that many lenders, the
// bandwidth split evenly over them.
func validateNICRequest(r *api.LeaseRequest) error {
	if r.Kind != api.KindNIC {
		return nil
	}
	const maxRate = 1 << 50 // bytes/s: 9 Pbit/s, far above any interface
	switch {
	case r.Size != 0:
		return fmt.Errorf("%w: a nic lease is sized by bandwidth (bytes/s; --bandwidth 500Mbit/s), not size", ErrInvalid)
	case r.StripeUnit != 0:
		return fmt.Errorf("%w: stripe_unit applies to composed block and memory leases, not nic (a bond spreads flows)", ErrInvalid)
	case r.Bandwidth > maxRate || math.IsNaN(r.Bandwidth):
		return fmt.Errorf("%w: bandwidth %s is more than any interface carries (at most %s)", ErrInvalid, resource.FormatLinkRate(r.Bandwidth), resource.FormatLinkRate(maxRate))
	case r.Bandwidth > 0 && r.Bandwidth < 1:
		return fmt.Errorf("%w: bandwidth below 1 byte/s", ErrInvalid)
	}
	if r.Mode == api.ModeDedicated {
		r.Whole = true
	}
	if r.Count > 1 {
		switch {
		case r.Whole:
			return fmt.Errorf("%w: a bond (count %d) takes a share of each lender's interface: give its total bandwidth, not whole or dedicated", ErrInvalid, r.Count)
		case r.Bandwidth == 0:
			return fmt.Errorf("%w: a bond (count %d) needs a bandwidth, the bond's total (split evenly over its lenders)", ErrInvalid, r.Count)
		case r.Mode == api.ModeShared:
			return fmt.Errorf("%w: count %d bonds lenders: mode composed (or none), not shared", ErrInvalid, r.Count)
		}
	}
	if r.Whole && r.Mode == api.ModeShared {
		return fmt.Errorf("%w: a whole interface is dedicated, not shared", ErrInvalid)
	}
	r.Size = int64(math.Round(r.Bandwidth))
	return nil
}

// validateAccelRequest checks the accelerator fields: a role (and its
// config) only for accel leases, and shared use — through the lender's
// batching gateway — only with a role to share. The role config is a
// secret: messages never quote it.
func validateAccelRequest(r *api.LeaseRequest) error {
	if r.Kind != api.KindAccel {
		if r.Role != "" || r.RoleConfig != nil {
			return fmt.Errorf("%w: role and role_config apply to accel leases only", ErrInvalid)
		}
		if r.Share != 0 {
			return fmt.Errorf("%w: share applies to shared accel leases only, not to %s %s lease", ErrInvalid, r.Kind.Article(), r.Kind)
		}
		return nil
	}
	if r.RoleConfig != nil {
		if r.Role == "" {
			return fmt.Errorf("%w: role_config needs a role", ErrInvalid)
		}
		if n := len(r.RoleConfig.Config) + len(r.RoleConfig.Module); n > api.MaxRoleConfig {
			return fmt.Errorf("%w: role_config of %d bytes is more than %d; load large roles through the appliance's management API", ErrInvalid, n, api.MaxRoleConfig)
		}
	}
	if r.Mode == api.ModeComposed {
		return fmt.Errorf("%w: an accel lease is dedicated (slots of its own; --count N for several) or shared (through the lender's gateway), not composed", ErrInvalid)
	}
	if r.Whole && r.Mode == api.ModeShared {
		return fmt.Errorf("%w: a whole device is dedicated, not shared", ErrInvalid)
	}
	if r.Share != 0 && r.Mode != api.ModeShared {
		return fmt.Errorf("%w: share applies to shared accel leases (mode shared); a dedicated lease takes whole slots (--count N)", ErrInvalid)
	}
	if r.Mode == api.ModeShared {
		if r.Role == "" {
			return fmt.Errorf("%w: a shared accel lease is served by the lender's batching gateway for a role: give a role", ErrInvalid)
		}
		if r.Count > 1 {
			return fmt.Errorf("%w: a shared accel lease takes count 1 and a share of one slot (--share)", ErrInvalid)
		}
		if r.Share == 0 {
			r.Share = api.DefaultShare
		}
		if math.IsNaN(r.Share) || r.Share < 1.0/api.SlotUnits || r.Share > 1 {
			return fmt.Errorf("%w: share %g is not a share of one slot (from %g to 1)", ErrInvalid, r.Share, 1.0/api.SlotUnits)
		}
		// In whole slot units, so that the request (and its idempotency
		// hash) says exactly what the lease holds.
		r.Share = float64(shareUnits(r.Share)) / api.SlotUnits
	}
	return nil
}

// shareUnits is a share of one slot in slot units (api.SlotUnits a slot).
func shareUnits(share float64) int64 { return int64(math.Round(share * api.SlotUnits)) }

func requestHash(r api.LeaseRequest) string {
	r.IdempotencyKey = ""
	b, _ := json.Marshal(r)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// replay answers a repeated idempotency key.
func (s *Server) replay(ctx context.Context, idem *store.Idempotency) (api.Lease, error) {
	l, hash, err := s.st.LeaseByIdempotencyKey(ctx, idem.Tenant, idem.Key)
	if err != nil {
		return l, err
	}
	if hash != idem.RequestHash {
		return api.Lease{}, fmt.Errorf("%w: idempotency key %q was used by lease %s with a different request", ErrConflict, idem.Key, l.ID)
	}
	return l, nil
}

func sizeText(req api.LeaseRequest) string {
	if req.Kind == api.KindNIC {
		if req.Size == 0 {
			return "a whole interface"
		}
		return resource.FormatLinkRate(float64(req.Size))
	}
	if req.Kind == api.KindAccel {
		if req.Whole {
			return "a whole device"
		}
		if req.Mode == api.ModeShared {
			return placement.FormatSlots(shareUnits(req.Share), api.SlotUnits)
		}
		if req.Count > 1 {
			return strconv.Itoa(req.Count) + " slots"
		}
		return "1 slot"
	}
	if req.Size == 0 || req.Whole {
		return "a whole device"
	}
	return resource.FormatSize(req.Size)
}
