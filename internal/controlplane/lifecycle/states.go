package lifecycle

import "github.com/rialto-project/rialto/api"

// States are the lease states, in lifecycle order.
var States = []api.LeaseState{api.LeaseRequested, api.LeaseReserved, api.LeaseActive, api.LeaseReleasing,
	api.LeaseReleased, api.LeaseFailed, api.LeaseLost, api.LeaseExpired}

// transitions are the state changes a write may make. A lease is created
// reserved (requested is the instant before its reservation is written);
// reserved → reserved is a re-placement after a lender did not confirm,
// active → active a renewal or a moved export.
var transitions = map[api.LeaseState][]api.LeaseState{
	api.LeaseRequested: {api.LeaseReserved, api.LeaseFailed},
	api.LeaseReserved:  {api.LeaseReserved, api.LeaseActive, api.LeaseReleasing, api.LeaseFailed, api.LeaseLost, api.LeaseExpired},
	api.LeaseActive:    {api.LeaseActive, api.LeaseReleasing, api.LeaseLost, api.LeaseExpired},
	api.LeaseReleasing: {api.LeaseReleased, api.LeaseLost},
}

// Allowed reports whether a lease may go from one state to another.
func Allowed(from, to api.LeaseState) bool {
	for _, t := range transitions[from] {
		if t == to {
			return true
		}
	}
	return false
}

// Sources returns the states from which to is reachable.
func Sources(to api.LeaseState) []api.LeaseState {
	var out []api.LeaseState
	for _, from := range States {
		if Allowed(from, to) {
			out = append(out, from)
		}
	}
	return out
}
