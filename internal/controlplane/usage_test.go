package controlplane

import (
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

func TestUsageRing(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	var u usageTracker
	beat := func(s float64, read, written int64) {
		u.record("n1", []api.DeviceCounters{{Name: "disk0", ReadBytes: read, WrittenBytes: written, UsedBytes: &written}}, at(s))
	}
	dev := []api.Device{{ID: "d0", NodeID: "n1", Name: "disk0"}, {ID: "d1", NodeID: "n1", Name: "disk1"}}

	// Idle: a flat stretch keeps two points, its ends.
	for s := 0.0; s <= 10; s++ {
		beat(s, 0, 0)
	}
	if r := u.rings[usageKey{"n1", "disk0"}]; r.len() != 2 || !r.at(1).at.Equal(at(10)) {
		t.Fatalf("idle ring: %d points, last at %v", r.len(), r.at(r.len()-1).at)
	}
	// Busy, with heartbeats every 250ms: samples at least usageGap apart.
	for i := 1; i <= 8; i++ {
		beat(10+0.25*float64(i), 0, int64(i)*1e6)
	}
	us := u.usage(dev)
	if len(us) != 1 || us[0].DeviceID != "d0" {
		t.Fatalf("usage: %+v", us)
	}
	got := us[0]
	for i, s := range got.Samples[1:] {
		if gap := s.At.Sub(got.Samples[i].At); gap < usageGap {
			t.Errorf("samples %v apart", gap)
		}
	}
	// 8 MB over the 2 s since the idle stretch ended.
	var sum float64
	var prev time.Time = at(10)
	for _, s := range got.Samples {
		if s.At.After(at(10)) {
			sum += s.WriteBps * s.At.Sub(prev).Seconds()
			prev = s.At
		}
	}
	if sum < 7.99e6 || sum > 8.01e6 || got.UsedBytes == nil || *got.UsedBytes != 8e6 {
		t.Errorf("bytes written by the samples %v, used %v; want 8e6", sum, got.UsedBytes)
	}
	// A restarted agent's counters start again from zero: no negative rate.
	beat(13, 0, 1e6)
	beat(14.5, 0, 2e6)
	for _, s := range u.usage(dev)[0].Samples {
		if s.WriteBps < 0 || s.ReadBps < 0 {
			t.Errorf("negative rate %+v", s)
		}
	}
	// A late heartbeat is ignored; the ring never holds more than usageSamples.
	beat(1, 5, 5)
	for i := range 3 * usageSamples {
		beat(20+float64(i), int64(i)*10, 0)
	}
	r := u.rings[usageKey{"n1", "disk0"}]
	if r.len() != usageSamples {
		t.Errorf("ring holds %d points", r.len())
	}
	for i := 1; i < r.len(); i++ {
		if !r.at(i).at.After(r.at(i - 1).at) {
			t.Fatalf("ring out of order at %d", i)
		}
	}
	// Link load: 10 B/s of reads over the last 10 s, on node n1's uplink only.
	now := at(20 + 3*usageSamples - 1)
	links := []api.Link{{From: "n1", To: "controlplane"}, {From: "n1", To: "n2"}, {From: "n2", To: "controlplane"}}
	out := u.withLoad(links, now)
	if out[0].LoadBps != 10 || out[1].LoadBps != 0 || out[2].LoadBps != 0 || links[0].LoadBps != 0 {
		t.Errorf("loads %+v (given %+v)", out, links)
	}
	// A stale report carries no load.
	if out := u.withLoad(links, now.Add(usageFresh+time.Second)); out[0].LoadBps != 0 {
		t.Errorf("stale load %+v", out[0])
	}
}

func TestCheckUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cs []api.DeviceCounters
		ok bool
	}{
		{nil, true},
		{[]api.DeviceCounters{{Name: "d", ReadBytes: 1, WrittenBytes: 2, UsedBytes: ptr(int64(3))}}, true},
		{[]api.DeviceCounters{{Name: "d", ReadBytes: 1, WrittenBytes: 2}}, true},
		{[]api.DeviceCounters{{Name: ""}}, false},
		{[]api.DeviceCounters{{Name: "d", ReadBytes: -1}}, false},
		{[]api.DeviceCounters{{Name: "d", UsedBytes: ptr(int64(-1))}}, false},
		{make([]api.DeviceCounters, 4097), false},
	} {
		if err := checkUsage(c.cs); (err == nil) != c.ok {
			t.Errorf("%d counters: %v", len(c.cs), err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// A device whose agent does not know what it holds has no used_bytes.
func TestUsageUnknownUsed(t *testing.T) {
	t.Parallel()
	var u usageTracker
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	u.record("n1", []api.DeviceCounters{{Name: "nvme0", ReadBytes: 1}}, t0)
	u.record("n1", []api.DeviceCounters{{Name: "nvme0", ReadBytes: 2e6}}, t0.Add(2*time.Second))
	us := u.usage([]api.Device{{ID: "d0", NodeID: "n1", Name: "nvme0"}})
	if len(us) != 1 || us[0].UsedBytes != nil || us[0].ReadBps < 0.99e6 {
		t.Fatalf("%+v", us)
	}
}
