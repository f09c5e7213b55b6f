package controlplane

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// BenchmarkHeartbeatHandler measures the heartbeat route (on SQLite) of
// a node that serves n leases, its lists complete, with and without its
// exports by part (api.Heartbeat.Exports).
func BenchmarkHeartbeatHandler(b *testing.B) {
	for _, n := range []int{0, 10, 100, 1000} {
		for _, exports := range []bool{false, true} {
			b.Run(fmt.Sprintf("leases=%d/exports=%v", n, exports), func(b *testing.B) { benchHeartbeat(b, n, exports) })
		}
	}
}

func benchHeartbeat(b *testing.B, n int, exports bool) {
	ctx := b.Context()
	_, call := sqliteHandler(ctx, b)
	join, _ := json.Marshal(joinRequest("n1", "", 1<<40))
	rec := call(http.MethodPost, "/v1/join", bootTok, join)
	var jr api.JoinResponse
	if json.Unmarshal(rec.Body.Bytes(), &jr) != nil {
		b.Fatalf("join: %d %s", rec.Code, rec.Body)
	}
	hb := api.Heartbeat{Health: "ok", LeasesComplete: true, Links: []api.LinkReport{{To: "controlplane", RTTMicros: 80, Up: true}},
		Usage: []api.DeviceCounters{{Name: "disk0", ReadBytes: 1 << 30, WrittenBytes: 1 << 30}}, Version: "dev"}
	for i := range n {
		rec := call(http.MethodPost, "/v1/leases", aliceTok, []byte(`{"kind":"block","size":1048576}`))
		var l api.Lease
		if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &l) != nil {
			b.Fatalf("lease %d: %d %s", i, rec.Code, rec.Body)
		}
		hb.Leases = append(hb.Leases, l.ID)
		if exports {
			p := l.Parts[0]
			hb.Exports = append(hb.Exports, api.ServedExport{LeaseID: l.ID, DeviceID: p.DeviceID, Offset: p.Offset, Length: p.Length})
		}
	}
	hb.ExportsComplete = exports
	path := "/v1/nodes/" + jr.NodeID + "/heartbeat"
	var resp api.HeartbeatResponse
	beat := func() {
		body, _ := json.Marshal(hb)
		rec := call(http.MethodPost, path, jr.Credential, body)
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &resp) != nil {
			b.Fatalf("heartbeat: %d %s", rec.Code, rec.Body)
		}
		hb.Check = resp.Check
	}
	beat()
	body, _ := json.Marshal(hb)
	b.ResetTimer()
	for range b.N {
		beat()
	}
	b.ReportMetric(float64(len(body)), "body-bytes")
}
