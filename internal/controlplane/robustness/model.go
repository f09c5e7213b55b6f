package robustness

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/rialto-project/rialto/api"
)

// Op kinds.
const (
	OpCreate  = "create"
	OpRenew   = "renew"
	OpRelease = "release"
	OpGet     = "get"
)

// Outcomes.
const (
	Ok       = "ok"       // the server did it (a lease, for create and get)
	Refused  = "refused"  // the server definitively did nothing (quota, capacity, conflict)
	NotFound = "notfound" // the server does not know the lease
	Unknown  = "unknown"  // no definitive answer: it may or may not have happened
)

// Input is an operation's request.
type Input struct {
	Op     string
	Tenant string
	ID     string // renew, release, get
}

// Output is an operation's outcome. For a create or get that is Ok: the
// lease's ID, state and (create) its one part's range.
type Output struct {
	Result string
	ID     string
	State  api.LeaseState
	Device string
	Off    int64
	Len    int64
}

// live is a lease the model holds active.
type live struct {
	ID, Tenant, Device string
	Off, Len           int64
}

// state is the model's lease table: the leases that are active, sorted by
// ID. A lease a client created and that is not here has ended: every
// operation on a lease follows its acknowledged creation, so the
// linearization has created it before.
type state []live

func (s state) find(id string) int {
	i, ok := slices.BinarySearchFunc(s, id, func(l live, id string) int { return strings.Compare(l.ID, id) })
	if !ok {
		return -1
	}
	return i
}

func (s state) without(i int) state { return slices.Delete(slices.Clone(s), i, i+1) }

func (s state) with(l live) state {
	out := append(slices.Clone(s), l)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Model is the lease table's sequential specification, with quota (the
// leases each tenant may hold at once; 0: unlimited).
type Model struct {
	Quota map[string]int
	// ForgetReleases is a deliberate bug, for the test that shows a
	// broken model failing a correct history: released leases stay
	// active in the model.
	ForgetReleases bool
}

// step returns the states the table may be in after the operation, none
// if the operation's outcome is impossible from s.
func (m Model) step(s state, in Input, out Output) []state {
	if out.Result == Unknown {
		if in.Op == OpRelease {
			// It may have ended the lease, or not.
			if i := s.find(in.ID); i >= 0 && !m.ForgetReleases {
				return []state{s, s.without(i)}
			}
		}
		// An unknown create's lease is never used (its ID is unknown), an
		// unknown renew or get changes nothing.
		return []state{s}
	}
	i := -1
	if in.ID != "" {
		i = s.find(in.ID)
	}
	switch in.Op {
	case OpCreate:
		if out.Result != Ok {
			return []state{s}
		}
		if s.find(out.ID) >= 0 {
			return nil // one lease created twice
		}
		held := 0
		for _, l := range s {
			if l.Tenant == in.Tenant {
				held++
			}
			if l.Device == out.Device && l.Off < out.Off+out.Len && out.Off < l.Off+l.Len {
				return nil // the range is held by another active lease
			}
		}
		if q := m.Quota[in.Tenant]; q > 0 && held+1 > q {
			return nil // over quota
		}
		return []state{s.with(live{ID: out.ID, Tenant: in.Tenant, Device: out.Device, Off: out.Off, Len: out.Len})}
	case OpRenew:
		switch out.Result {
		case Ok:
			if i < 0 {
				return nil // a released lease renewed: it came back
			}
		case NotFound:
			return nil // an acknowledged lease disappeared
		}
		return []state{s}
	case OpRelease:
		switch out.Result {
		case Ok:
			if i >= 0 && !m.ForgetReleases {
				return []state{s.without(i)}
			}
			return []state{s} // released before (a retry's answer)
		case NotFound:
			return nil
		}
		return []state{s}
	case OpGet:
		switch out.Result {
		case NotFound:
			return nil // an acknowledged lease disappeared
		case Ok:
			switch out.State {
			case api.LeaseActive, api.LeaseReserved:
				if i < 0 {
					return nil // a released lease is active again
				}
			case api.LeaseReleasing, api.LeaseReleased:
				if i >= 0 {
					return nil
				}
			default:
				return nil // an acknowledged lease failed, expired or was lost: none of that is provoked here
			}
		}
		return []state{s}
	}
	return nil
}

// Porcupine returns the model for the checker.
func (m Model) Porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{state{}} },
		Step: func(st, in, out interface{}) []interface{} {
			var next []interface{}
			for _, s := range m.step(st.(state), in.(Input), out.(Output)) {
				next = append(next, s)
			}
			return next
		},
		Equal: func(a, b interface{}) bool { return slices.Equal(a.(state), b.(state)) },
		Hash: func(st interface{}) uint64 {
			h := fnv.New64a()
			for _, l := range st.(state) {
				h.Write([]byte(l.ID))
			}
			return h.Sum64()
		},
		DescribeOperation: func(in, out interface{}) string {
			i, o := in.(Input), out.(Output)
			s := fmt.Sprintf("%s(%s %s) → %s", i.Op, i.Tenant, i.ID, o.Result)
			if o.Result == Ok && i.Op == OpCreate {
				s += fmt.Sprintf(" %s %s[%d+%d]", o.ID, o.Device, o.Off, o.Len)
			}
			if o.State != "" {
				s += " " + string(o.State)
			}
			return s
		},
		DescribeState: func(st interface{}) string {
			var b strings.Builder
			for _, l := range st.(state) {
				fmt.Fprintf(&b, "%s(%s %s[%d+%d]) ", l.ID, l.Tenant, l.Device, l.Off, l.Len)
			}
			return b.String()
		},
	}
	return nm.ToModel()
}
