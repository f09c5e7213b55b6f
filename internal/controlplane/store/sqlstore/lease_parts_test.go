package sqlstore

import (
	"errors"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// TestJudgeLimitSlots: accel parts charge their slot units, and a refusal
// speaks of slots as the quota was given (2.25 of 2), not of units.
func TestJudgeLimitSlots(t *testing.T) {
	l := api.Lease{ID: "l", Tenant: "t", Kind: api.KindAccel, Mode: api.ModeShared,
		Parts: []api.Part{{DeviceID: "d", Offset: 0, Length: 250}}}
	devs := []PartRow{{DKind: string(api.KindAccel), Capacity: 2 * api.SlotUnits}}
	lim := store.Limit{Slots: 2 * api.SlotUnits}
	if err := JudgeLimit(l, store.Demand{}, lim, Usage{Slots: 1750}, devs); err != nil {
		t.Fatalf("2 of 2 slots refused: %v", err)
	}
	err := JudgeLimit(l, store.Demand{}, lim, Usage{Slots: 2000}, devs)
	if !errors.Is(err, store.ErrQuota) || !strings.Contains(err.Error(), "would hold 2.25 of 2 slots") {
		t.Fatalf("2.25 of 2 slots: %v", err)
	}
}

// TestJudgeLimitBandwidth: a refusal over the bandwidth quota gives the
// rates as every rate prints (resource.FormatRate), as placement's does,
// not bytes/s figures.
func TestJudgeLimitBandwidth(t *testing.T) {
	l := api.Lease{ID: "l", Tenant: "t", Kind: api.KindBlock, Parts: []api.Part{{DeviceID: "d", Length: 1 << 20}}}
	devs := []PartRow{{DKind: string(api.KindBlock), Capacity: 1 << 30}}
	lim := store.Limit{Bandwidth: 250e6}
	if err := JudgeLimit(l, store.Demand{Bandwidth: 50e6}, lim, Usage{BW: 200e6}, devs); err != nil {
		t.Fatalf("250MB/s of 250MB/s refused: %v", err)
	}
	err := JudgeLimit(l, store.Demand{Bandwidth: 62.5e6}, lim, Usage{BW: 200e6}, devs)
	if !errors.Is(err, store.ErrQuota) || !strings.Contains(err.Error(), "tenant t would use 262.5MB/s of 250MB/s") || strings.Contains(err.Error(), "bit/s") {
		t.Fatalf("262.5MB/s of 250MB/s: %v", err)
	}
	// A nic lease's rate is a link rate, with the bytes/s the quota
	// counts; the quota's figures stay bytes/s.
	l = api.Lease{ID: "n", Tenant: "t", Kind: api.KindNIC, Mode: api.ModeShared, Parts: []api.Part{{DeviceID: "w", Length: 62.5e6}}}
	err = JudgeLimit(l, store.Demand{Bandwidth: 62.5e6}, lim, Usage{BW: 200e6}, []PartRow{{DKind: string(api.KindNIC), Capacity: 125e6}})
	if !errors.Is(err, store.ErrQuota) || !strings.Contains(err.Error(), "tenant t would use 262.5MB/s of 250MB/s with this nic lease's 500Mbit/s (62.5MB/s):") {
		t.Fatalf("a nic lease's 500Mbit/s over 250MB/s: %v", err)
	}
}

// TestJudgeLimitBytes: a refusal over the byte quota gives the sizes as
// every size prints (resource.FormatSize), as placement's does, not byte
// counts; a dedicated part charges its whole device.
func TestJudgeLimitBytes(t *testing.T) {
	l := api.Lease{ID: "l", Tenant: "t", Kind: api.KindBlock, Parts: []api.Part{{DeviceID: "d", Length: 1 << 20}}}
	devs := []PartRow{{DKind: string(api.KindBlock), Capacity: 1 << 30}}
	lim := store.Limit{Bytes: 3 << 20}
	if err := JudgeLimit(l, store.Demand{}, lim, Usage{Bytes: 2 << 20}, devs); err != nil {
		t.Fatalf("3MiB of 3MiB refused: %v", err)
	}
	err := JudgeLimit(l, store.Demand{}, lim, Usage{Bytes: 3 << 20}, devs)
	if !errors.Is(err, store.ErrQuota) || !strings.Contains(err.Error(), "tenant t would hold 4MiB of 3MiB:") {
		t.Fatalf("4MiB of 3MiB: %v", err)
	}
	l.Mode = api.ModeDedicated
	err = JudgeLimit(l, store.Demand{}, store.Limit{Bytes: 1 << 30}, Usage{Bytes: 512 << 20}, devs)
	if !errors.Is(err, store.ErrQuota) || !strings.Contains(err.Error(), "tenant t would hold 1.5GiB of 1GiB:") {
		t.Fatalf("1.5GiB of 1GiB: %v", err)
	}
}
