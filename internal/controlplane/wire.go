package controlplane

import (
	"reflect"
	"slices"

	"github.com/rialto-project/rialto/api"
)

// wireForm puts an answer in the shape the OpenAPI document promises: an
// array field without omitempty is required and not nullable there, so a
// nil slice (which encoding/json writes as null) becomes an empty one, and
// so does a nil list answer. It copies what it changes and never writes
// to v's backing arrays, which the store may share with other requests.
func wireForm(v any) any {
	switch x := v.(type) {
	case api.Lease:
		return wireLease(x)
	case []api.Lease:
		if x == nil {
			return []api.Lease{}
		}
		out := make([]api.Lease, len(x))
		for i, l := range x {
			out[i] = wireLease(l)
		}
		return out
	case api.Plan:
		return wirePlan(x)
	case api.Profile:
		return wireProfile(x)
	case []api.Profile:
		if x == nil {
			return []api.Profile{}
		}
		out := make([]api.Profile, len(x))
		for i, p := range x {
			out[i] = wireProfile(p)
		}
		return out
	case api.Node:
		return wireNode(x)
	case []api.Node:
		return wireNodes(x)
	case api.NodeRemoval:
		x.Node = wireNode(x.Node)
		return x
	case api.Topology:
		x.Nodes = wireNodes(x.Nodes)
		if x.Links == nil {
			x.Links = []api.Link{}
		}
		return x
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice && rv.IsNil() {
		return reflect.MakeSlice(rv.Type(), 0, 0).Interface()
	}
	return v
}

// wireLease also gives a lease its count and held, from its parts: they
// change when a lease is placed again or a bond loses a part, and the
// API's figures must say what the lease holds now. For the same reason
// its node and device are those of its first part that is not lost: a
// bond that lost its first lender is not shown on it.
func wireLease(l api.Lease) api.Lease {
	if l.Parts == nil {
		l.Parts = []api.Part{}
	}
	if len(l.Parts) > 0 {
		l.Count, l.Held = api.Holding(l.Parts)
		if l.Parts[0].Lost() {
			if i := slices.IndexFunc(l.Parts, func(p api.Part) bool { return !p.Lost() }); i > 0 {
				l.NodeID, l.DeviceID = l.Parts[i].NodeID, l.Parts[i].DeviceID
			}
		}
	}
	if l.Plan != nil && l.Plan.Parts == nil {
		pl := wirePlan(*l.Plan)
		l.Plan = &pl
	}
	return l
}

func wireNodes(ns []api.Node) []api.Node {
	out := make([]api.Node, len(ns))
	for i, n := range ns {
		out[i] = wireNode(n)
	}
	return out
}

// wireNode answers a node that is not ready with its health unknown: the
// store keeps the agent's last report, which is not current once its
// heartbeats stopped, and goes in last_health.
func wireNode(n api.Node) api.Node {
	if n.State != api.NodeReady {
		n.LastHealth, n.Health = n.Health, api.HealthUnknown
	}
	return n
}

func wirePlan(p api.Plan) api.Plan {
	if p.Parts == nil {
		p.Parts = []api.Part{}
	}
	return p
}

func wireProfile(p api.Profile) api.Profile {
	if p.WriteBps == nil {
		p.WriteBps = []float64{}
	}
	if p.ReadBps == nil {
		p.ReadBps = []float64{}
	}
	return p
}
