package controlplane

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
	"github.com/rialto-project/rialto/internal/resource"
)

// transitions is the lease state machine (ARCHITECTURE §2). A lease is
// created reserved (requested is the instant before the reservation
// commits); reserved → reserved is a re-placement after a lender did not
// confirm, active → active a renewal.
var transitions = map[api.LeaseState][]api.LeaseState{
	api.LeaseRequested: {api.LeaseReserved, api.LeaseFailed},
	api.LeaseReserved:  {api.LeaseReserved, api.LeaseActive, api.LeaseReleasing, api.LeaseFailed, api.LeaseLost, api.LeaseExpired},
	api.LeaseActive:    {api.LeaseActive, api.LeaseReleasing, api.LeaseLost, api.LeaseExpired},
	api.LeaseReleasing: {api.LeaseReleased, api.LeaseLost},
}

// canTransition reports whether a lease may go from one state to another.
func canTransition(from, to api.LeaseState) bool {
	for _, t := range transitions[from] {
		if t == to {
			return true
		}
	}
	return false
}

// sources returns the states from which to is reachable.
func sources(to api.LeaseState) []api.LeaseState {
	var out []api.LeaseState
	for _, from := range []api.LeaseState{api.LeaseRequested, api.LeaseReserved, api.LeaseActive, api.LeaseReleasing} {
		if canTransition(from, to) {
			out = append(out, from)
		}
	}
	return out
}

// transition moves a lease to state to, from any state allowed by the state
// machine (and, if from is non-empty, only from those).
func (s *Server) transition(ctx context.Context, id string, to api.LeaseState, ch store.LeaseChange, msg string, from ...api.LeaseState) (api.Lease, error) {
	allowed := sources(to)
	if len(from) > 0 {
		var f []api.LeaseState
		for _, st := range from {
			if canTransition(st, to) {
				f = append(f, st)
			}
		}
		allowed = f
	}
	ch.From, ch.To = allowed, to
	now := s.now()
	if ch.At.IsZero() {
		ch.At = now
	}
	if msg == "" {
		msg = ch.Reason
	}
	l, err := s.leases.do(ctx, s.st, store.LeaseOp{Transition: store.Transition{ID: id, Change: ch,
		Event: api.Event{At: now, Type: "lease." + string(to), Subject: id, Message: msg, State: string(to)}}})
	if err == nil {
		s.m.leaseTransitions.With(string(to)).Inc()
		if to.Terminal() {
			s.res.Release(id)
		}
	}
	return l, err
}

const (
	maxPlaceAttempts   = 16 // reservation races lost before giving up
	maxPrepareRounds   = 8  // lenders skipped before giving up
	maxParts           = 64
	maxIdempotencyKey  = 200
	idempotencyHeader  = "Idempotency-Key"
	prepareStaleFactor = maxPrepareRounds + 2
)

// validateLeaseRequest checks a request and fills defaults.
func (s *Server) validateLeaseRequest(r *api.LeaseRequest) error {
	switch r.Kind {
	case api.KindBlock, api.KindMemory, api.KindAccel:
	case "":
		return fmt.Errorf("%w: kind is required (block, memory or accel)", ErrInvalid)
	default:
		return fmt.Errorf("%w: unknown kind %q (block, memory or accel)", ErrInvalid, r.Kind)
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
	return validateAccelRequest(r)
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
	if r.Mode == api.ModeShared {
		if r.Role == "" {
			return fmt.Errorf("%w: a shared accel lease is served by the lender's batching gateway for a role: give a role", ErrInvalid)
		}
		if r.Count > 1 {
			return fmt.Errorf("%w: a shared accel lease takes count 1 (the gateway spreads work over its slots)", ErrInvalid)
		}
	}
	return nil
}

func requestHash(r api.LeaseRequest) string {
	r.IdempotencyKey = ""
	b, _ := json.Marshal(r)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
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

// createLease runs the whole reservation: place, reserve, prepare on the
// lenders, activate; lenders that do not confirm are skipped and the lease
// re-placed elsewhere. created is false for an idempotent replay.
func (s *Server) createLease(ctx context.Context, p principal, req api.LeaseRequest) (l api.Lease, created bool, err error) {
	if err := s.validateLeaseRequest(&req); err != nil {
		return l, false, err
	}
	var idem *store.Idempotency
	if req.IdempotencyKey != "" {
		idem = &store.Idempotency{Tenant: p.tenant, Key: req.IdempotencyKey, RequestHash: requestHash(req)}
		if l, err := s.replay(ctx, idem); !errors.Is(err, store.ErrNotFound) {
			return l, false, err
		}
	}
	now := s.now()
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl == 0 {
		ttl = s.cfg.DefaultTTL
	}
	count := req.Count
	if count == 0 {
		count = 1
	}
	demand := store.Demand{Bandwidth: req.Bandwidth, Work: req.Work}
	if req.DeadlineSecond > 0 {
		demand.Deadline = now.Add(time.Duration(req.DeadlineSecond * float64(time.Second)))
	}
	skip := map[string]string{}
	var plan api.Plan
	var lease api.Lease
	// The reserver places the request and holds the plan's parts in its
	// view, so that concurrent requests place around them instead of
	// racing for the same free range. The reservation is then written
	// with other requests' writes in one transaction (group commit); the
	// store re-checks every part atomically, so a stale view costs a
	// retry, never an over-commit. A refused write is taken out of the
	// view again.
	for attempt := 0; ; attempt++ {
		id := resource.NewID("lease")
		plan, err = s.res.Place(ctx, hold{id: id, tenant: p.tenant, kind: req.Kind, demand: demand}, req, nil, now)
		if err != nil {
			return l, false, err
		}
		lease = api.Lease{
			ID: id, State: api.LeaseReserved, Kind: req.Kind, Mode: plan.Mode, Tenant: p.tenant,
			Borrower: req.Borrower, Size: req.Size, Count: count, StripeUnit: req.StripeUnit, Parts: plan.Parts,
			Credential: resource.NewSecret("rlc"), TTLSeconds: int64(ttl / time.Second), ExpiresAt: now.Add(ttl),
			CreatedAt: now, UpdatedAt: now, IdempotencyKey: req.IdempotencyKey,
		}
		if lease.Mode == api.ModeComposed && lease.StripeUnit == 0 && req.Kind != api.KindAccel {
			lease.StripeUnit = defaultStripeUnit
		}
		lease.Plan = &plan
		created, err := s.leases.do(ctx, s.st, store.LeaseOp{Create: &store.NewLease{Lease: lease, Demand: demand, Idem: idem,
			Event: api.Event{At: now, Type: "lease.reserved", Subject: lease.ID, State: string(api.LeaseReserved),
				Message: "tenant " + p.tenant + ": " + string(lease.Mode) + " " + string(req.Kind) + " " + sizeText(req) + " on " + strconv.Itoa(len(plan.Parts)) + " part(s)"}}})
		if err == nil {
			s.res.Commit(lease.ID)
			lease = created
			break
		}
		s.res.Release(lease.ID)
		switch {
		case errors.Is(err, store.ErrDuplicate):
			l, err := s.replay(ctx, idem)
			return l, false, err
		case errors.Is(err, store.ErrCapacity) && attempt < maxPlaceAttempts:
			s.m.placeRetries.Inc()
			s.res.Invalidate() // lost a race for the device; place again on fresh data
			continue
		case errors.Is(err, store.ErrCapacity):
			return l, false, fmt.Errorf("%w: devices kept being taken by concurrent leases; try again", ErrUnavailable)
		default:
			return l, false, err
		}
	}
	s.m.leaseTransitions.With(string(api.LeaseReserved)).Inc()
	s.log.Info("lease reserved", "lease", lease.ID, "tenant", p.tenant, "mode", lease.Mode, "parts", len(lease.Parts))

	for round := 0; ; round++ {
		uris, failed := s.prepareParts(ctx, lease, req)
		if len(failed) == 0 {
			ch := store.LeaseChange{URIs: uris}
			if len(uris) == 1 {
				ch.URI = uris[0]
			}
			act, err := s.transition(ctx, lease.ID, api.LeaseActive, ch, fmt.Sprintf("%d lender(s) confirmed", len(uris)), api.LeaseReserved)
			if err != nil {
				// Released or expired while we prepared: undo the exports.
				s.teardownParts(ctx, lease)
				if errors.Is(err, store.ErrConflict) {
					cur, gerr := s.st.Lease(ctx, lease.ID)
					if gerr == nil {
						return cur, true, fmt.Errorf("%w: lease %s became %s while its lenders prepared it", ErrConflict, lease.ID, cur.State)
					}
				}
				return l, false, err
			}
			s.log.Info("lease active", "lease", lease.ID)
			return act, true, nil
		}
		// Some lenders did not confirm: undo the others, skip the failures.
		s.teardownParts(ctx, lease)
		for nodeID, why := range failed {
			skip[nodeID] = why
			s.log.Warn("lender did not confirm; skipping it", "lease", lease.ID, "node", nodeID, "err", why)
		}
		var why string
		if round+1 >= maxPrepareRounds {
			err = fmt.Errorf("%w: gave up after %d rounds", ErrUnavailable, round+1)
		} else {
			plan, err = s.res.Place(ctx, hold{id: lease.ID, tenant: p.tenant, kind: req.Kind, demand: demand}, req, skip, s.now())
		}
		if err == nil {
			var nl api.Lease
			nl, err = s.st.ReplaceParts(ctx, lease.ID, plan.Parts, &plan, s.now(), api.Event{At: s.now(), Type: "lease.replaced", Subject: lease.ID,
				Message: fmt.Sprintf("re-placed after %d lender(s) did not confirm", len(failed)), State: string(api.LeaseReserved)})
			if err == nil {
				s.res.Commit(lease.ID)
				lease = nl
				continue
			}
			s.res.Release(lease.ID)
		}
		why = fmt.Sprintf("lenders did not confirm (%s) and no other placement: %v", joinReasons(failed), err)
		fl, ferr := s.transition(ctx, lease.ID, api.LeaseFailed, store.LeaseChange{Reason: why, Plan: &plan}, "", api.LeaseReserved)
		if ferr != nil && !errors.Is(ferr, store.ErrConflict) {
			return l, false, ferr
		}
		s.log.Warn("lease failed", "lease", lease.ID, "reason", why)
		return fl, true, fmt.Errorf("%w: lease %s failed: %s", ErrUnavailable, lease.ID, why)
	}
}

func joinReasons(m map[string]string) string {
	out := ""
	for _, k := range sortedKeys(m) {
		if out != "" {
			out += "; "
		}
		out += k + ": " + m[k]
	}
	return out
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

// prepareParts asks every part's lender to prepare its export, in parallel,
// each within PrepareTimeout. It returns the URIs, or the nodes that failed.
// req supplies what the lease record does not keep: the role and the caps.
func (s *Server) prepareParts(ctx context.Context, l api.Lease, req api.LeaseRequest) ([]string, map[string]string) {
	uris := make([]string, len(l.Parts))
	errs := make([]error, len(l.Parts))
	nodes := map[string]store.NodeRecord{}
	failed := map[string]string{}
	for _, p := range l.Parts {
		if _, ok := nodes[p.NodeID]; ok {
			continue
		}
		n, err := s.nodeRecord(ctx, p.NodeID)
		if err != nil {
			failed[p.NodeID] = err.Error()
			continue
		}
		nodes[p.NodeID] = n
	}
	if len(failed) > 0 {
		return nil, failed
	}
	devNames := s.res.DeviceNames(ctx)
	prepare := func(i int, p api.Part) {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PrepareTimeout)
		defer cancel()
		n := nodes[p.NodeID]
		start := time.Now()
		resp, err := s.lender.Prepare(pctx, n.Node, n.AgentKey, api.PrepareRequest{
			LeaseID: l.ID, Kind: l.Kind, Mode: l.Mode, DeviceID: p.DeviceID, DeviceName: devNames[p.DeviceID],
			Offset: p.Offset, Length: p.Length, Export: partExport(l.Credential, i), Role: req.Role,
			RoleConfig: req.RoleConfig, Gateway: req.Kind == api.KindAccel && req.Mode == api.ModeShared,
			BandwidthCap: req.BandwidthCap, IOPSCap: req.IOPSCap, ExpiresAt: l.ExpiresAt, Now: s.now(),
		})
		s.m.lenderLatency.With("prepare").Observe(time.Since(start).Seconds())
		if err == nil && resp.URI == "" {
			err = errors.New("confirmed without a URI")
		}
		uris[i], errs[i] = resp.URI, err
	}
	if len(l.Parts) == 1 {
		prepare(0, l.Parts[0]) // the usual case needs no goroutine
	} else {
		var wg sync.WaitGroup
		for i, p := range l.Parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				prepare(i, p)
			}()
		}
		wg.Wait()
	}
	for i, err := range errs {
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("no confirmation within %v", s.cfg.PrepareTimeout)
			}
			failed[l.Parts[i].NodeID] = err.Error()
		}
	}
	if len(failed) > 0 {
		return nil, failed
	}
	return uris, nil
}

// partExport is the export name (the data-plane secret) of part i of the
// lease whose credential is given: HMAC-SHA256(credential, "part/"+i),
// base64url. The lender of one part learns nothing from it about the
// names of the other parts; the borrower gets every part's name in its
// URI.
func partExport(credential string, i int) string {
	m := hmac.New(sha256.New, []byte(credential))
	m.Write([]byte("part/" + strconv.Itoa(i)))
	return "rlp_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func sizeText(req api.LeaseRequest) string {
	if req.Kind == api.KindAccel {
		if req.Whole {
			return "a whole device"
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
