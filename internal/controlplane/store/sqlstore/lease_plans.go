package sqlstore

import (
	"context"
	"slices"

	"github.com/rialto-project/rialto/api"
)

// ReplacePlan replaces a stored lease's plan.
func (s *Core) ReplacePlan(ctx context.Context, tx Execer, id, plan string) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO lease_plans (created_at, lease_id, plan) SELECT created_at, id, ? FROM leases WHERE id = ?
		ON CONFLICT (created_at, lease_id) DO UPDATE SET plan = excluded.plan`, plan, id); err != nil {
		return s.wrap("lease plan", err)
	}
	return nil
}

// DecodePlan decodes a stored plan, through the Store's cache of decoded
// plans; every read gets its own copy.
func (s *Core) DecodePlan(text string) (*api.Plan, error) {
	p, ok := s.plans.Get(text)
	if !ok {
		p = new(api.Plan)
		if err := unjs(text, p); err != nil {
			return nil, err
		}
		s.plans.Put(text, p)
	}
	return ClonePlan(p), nil
}

func ClonePlan(p *api.Plan) *api.Plan {
	c := *p
	c.Parts = slices.Clone(p.Parts)
	c.Impacts = slices.Clone(p.Impacts)
	c.Explanation = slices.Clone(p.Explanation)
	return &c
}

// PlanJSON encodes a plan to store; the text is remembered so that reading
// the lease back does not decode it.
func (s *Core) PlanJSON(p *api.Plan) string {
	if p == nil {
		return ""
	}
	text := js(p)
	s.plans.Put(text, ClonePlan(p))
	return text
}
