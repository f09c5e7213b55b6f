package testcluster

import (
	"time"

	"github.com/rialto-project/rialto/internal/clock"
)

// Clock is the cluster's clock: what the control plane and the agents
// judge by (liveness, leases' expiries and TTLs) is fake time that tests
// move with Advance; what paces their loops (the agents' heartbeats every
// HeartbeatInterval) is real time, so that the cluster runs by itself
// between Advances (see clock.FakeNow).
type Clock = clock.FakeNow

// NewClock returns a clock set to t.
func NewClock(t time.Time) *Clock { return clock.NewFakeNow(t) }
