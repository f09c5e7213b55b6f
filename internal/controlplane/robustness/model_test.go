package robustness

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/rialto-project/rialto/api"
)

// op is a synthetic operation: client, call and return times (ms).
type op struct {
	client    int
	call, ret int64
	in        Input
	out       Output
}

func history(ops ...op) *History {
	h := NewHistory()
	for _, o := range ops {
		r := h.start.Add(time.Duration(o.ret) * time.Millisecond)
		h.Add(o.client, o.in, h.start.Add(time.Duration(o.call)*time.Millisecond), o.out, r)
	}
	return h
}

func create(c int, call, ret int64, tenant, id, dev string, off int64) op {
	return op{c, call, ret, Input{Op: OpCreate, Tenant: tenant}, Output{Result: Ok, ID: id, State: api.LeaseActive, Device: dev, Off: off, Len: 10}}
}

func opOn(c int, call, ret int64, kind, tenant, id, result string, st api.LeaseState) op {
	return op{c, call, ret, Input{Op: kind, Tenant: tenant, ID: id}, Output{Result: result, State: st}}
}

// TestModel: the checker accepts histories that keep the lease table's
// properties and rejects each planted violation.
func TestModel(t *testing.T) {
	m := Model{Quota: map[string]int{"a": 2}}
	for _, c := range []struct {
		name string
		h    *History
		ok   bool
	}{
		{"create release create", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			opOn(0, 20, 30, OpRelease, "a", "l1", Ok, api.LeaseReleased),
			create(1, 40, 50, "a", "l2", "d", 0),
		), true},
		{"concurrent release and create of the same range", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			opOn(0, 20, 60, OpRelease, "a", "l1", Ok, api.LeaseReleased),
			create(1, 30, 50, "a", "l2", "d", 0), // may linearize after the release
		), true},
		{"overlapping ranges", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			create(1, 20, 30, "b", "l2", "d", 5),
		), false},
		{"over quota", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			create(1, 0, 10, "a", "l2", "d", 10),
			create(2, 20, 30, "a", "l3", "d", 20),
		), false},
		{"acknowledged create disappears", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			opOn(0, 20, 30, OpGet, "a", "l1", NotFound, ""),
		), false},
		{"released lease comes back", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			opOn(0, 20, 30, OpRelease, "a", "l1", Ok, api.LeaseReleased),
			opOn(0, 40, 50, OpGet, "a", "l1", Ok, api.LeaseActive),
		), false},
		{"released lease renewed", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			opOn(0, 20, 30, OpRelease, "a", "l1", Ok, api.LeaseReleased),
			opOn(0, 40, 50, OpRenew, "a", "l1", Ok, ""),
		), false},
		{"unknown release may have happened", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			opOn(0, 20, 30, OpRelease, "a", "l1", Unknown, ""),
			create(1, 40, 50, "b", "l2", "d", 0),
		), true},
		{"unknown release may not have happened", history(
			create(0, 0, 10, "a", "l1", "d", 0),
			opOn(0, 20, 30, OpRelease, "a", "l1", Unknown, ""),
			opOn(1, 40, 50, OpGet, "a", "l1", Ok, api.LeaseActive),
		), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := Check(m, c.h, 10*time.Second, "")
			if (res == porcupine.Ok) != c.ok {
				t.Fatalf("checker says %s, want ok=%v", res, c.ok)
			}
		})
	}
	// A broken model (it never ends a lease) rejects a correct history.
	h := history(
		create(0, 0, 10, "a", "l1", "d", 0),
		opOn(0, 20, 30, OpRelease, "a", "l1", Ok, api.LeaseReleased),
		create(1, 40, 50, "a", "l2", "d", 0),
	)
	if res := Check(Model{Quota: m.Quota, ForgetReleases: true}, h, 10*time.Second, ""); res != porcupine.Illegal {
		t.Fatalf("broken model: %s", res)
	}
}
