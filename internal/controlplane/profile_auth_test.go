package controlplane

import (
	"testing"

	"github.com/rialto-project/rialto/api"
)

// TestNodeStoresProfilesOfItsOwnModelsOnly: a node credential stores the
// profile of a model one of its devices is, not another's; an admin any.
func TestNodeStoresProfilesOfItsOwnModelsOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	join := func(name, model string) *api.Client {
		req := api.JoinRequest{Name: name, Address: "127.0.0.1", AgentURL: "http://127.0.0.1:1",
			Fingerprint: api.Fingerprint{MachineID: "mid-" + name, Hostname: name, Cores: 2, MemoryBytes: 1 << 30},
			Devices:     []api.DeviceSpec{{Name: "disk0", Kind: api.KindBlock, Capacity: 1 << 30, Model: model, Sharing: "partitionable"}}}
		jr, err := e.boot.Join(e.ctx(), req)
		if err != nil {
			t.Fatal(err)
		}
		return e.boot.WithToken(jr.Credential)
	}
	n1 := join("n1", "fast-ssd")
	join("n2", "slow-hdd")
	prof := func(model string, bps float64) api.Profile {
		return api.Profile{Model: model, WriteBps: []float64{bps}, ReadBps: []float64{bps}, Source: "measured"}
	}
	if _, err := n1.PutProfile(e.ctx(), prof("fast-ssd", 2e9)); err != nil {
		t.Fatalf("node storing its own model's profile: %v", err)
	}
	for _, model := range []string{"slow-hdd", "nobody-has-this"} {
		_, err := n1.PutProfile(e.ctx(), prof(model, 1e12))
		if !api.IsCode(err, api.CodeForbidden) {
			t.Fatalf("node storing %s's profile: got %v, want forbidden", model, err)
		}
	}
	if _, err := e.admin.PutProfile(e.ctx(), prof("slow-hdd", 1e8)); err != nil {
		t.Fatalf("admin: %v", err)
	}
	ps, err := e.admin.Profiles(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, p := range ps {
		got[p.Model] = p.WriteBps[0]
	}
	if len(got) != 2 || got["fast-ssd"] != 2e9 || got["slow-hdd"] != 1e8 {
		t.Fatalf("profiles %v", got)
	}
}
