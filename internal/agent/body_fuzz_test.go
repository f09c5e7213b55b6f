package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/rialto-project/rialto/api"
)

// FuzzAgentBodies feeds arbitrary bodies to the agent API's routes other
// than prepare (FuzzPrepareRequest): teardown, role-config, and a
// transfer's in, out and commit, on an agent lending one export. None
// may panic or answer 500 (bad input is the caller's: a 4xx that says
// so); the export stays unless a teardown of its lease answered 200 (and goes then), and
// no transfer is left behind a refusal.
func FuzzAgentBodies(f *testing.F) {
	for _, c := range []struct {
		route byte
		id    string
		body  string
	}{
		{0, "", `{"lease_id":"lease-1"}`},
		{0, "", `{"lease_id":"lease-1","placement":"p","extra":1}`},
		{0, "", `{"lease_id":""}`},
		{1, "", `{"lease_id":"lease-1","export":"x_lease-1"}`},
		{1, "", `{"lease_id":"","export":""}`},
		{2, "", `{"id":"t1","token":"tok","part":{"lease_id":"lease-2","kind":"block","device_name":"disk0","offset":65536,"length":4096,"export":"x2"},"expires_at":"2030-01-01T00:00:00Z","now":"2029-12-31T23:00:00Z"}`},
		{2, "", `{"id":"t1","token":"","part":{"offset":-1}}`},
		{3, "", `{"id":"t2","lease_id":"lease-1","export":"x_lease-1","dest_uri":"nbd://127.0.0.1:1/tok","max_passes":-1,"converge_bytes":-5,"hold_seconds":1e300}`},
		{3, "", `{"id":"t2","lease_id":"lease-1","export":"nope","dest_uri":"::"}`},
		{4, "t1", `{"expires_at":"2030-01-01T00:00:00Z","now":"2029-12-31T23:00:00Z","timeout_seconds":5}`},
		{4, "t1", ``},
		{4, "../x", `{"future":true}`},
		{0, "", `null`}, {1, "", `[]`}, {2, "", `{"id":1}`}, {3, "", `{`},
	} {
		f.Add(c.route, c.id, []byte(c.body))
	}
	f.Fuzz(func(t *testing.T, route byte, id string, body []byte) {
		a := offlineAgent(t)
		if _, err := a.Prepare(context.Background(), api.PrepareRequest{LeaseID: "lease-1", Kind: api.KindBlock,
			DeviceName: "disk0", Length: 4096, Export: "x_lease-1"}); err != nil {
			t.Fatal(err)
		}
		paths := []string{"/agent/v1/teardown", "/agent/v1/role-config", "/agent/v1/transfers/in", "/agent/v1/transfers/out",
			"/agent/v1/transfers/" + url.PathEscape(id) + "/commit"}
		req := httptest.NewRequest(http.MethodPost, paths[int(route)%len(paths)], bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer k")
		rec := httptest.NewRecorder()
		a.Handler().ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s answered %d: %s", req.URL.Path, rec.Code, rec.Body)
		}
		a.mu.Lock()
		_, kept := a.exports["x_lease-1"]
		a.mu.Unlock()
		// A teardown answered 200 tears down the export if it named its
		// lease (as encoding/json reads it: keys in any case); one of
		// a lease the agent does not hold is answered 200 too
		// (teardowns are idempotent) and keeps it.
		var td api.TeardownRequest
		named := json.Unmarshal(body, &td) == nil && td.LeaseID == "lease-1"
		torn := route%5 == 0 && rec.Code == http.StatusOK && named
		if kept == torn {
			t.Fatalf("%s answered %d, and the export is kept: %v", req.URL.Path, rec.Code, kept)
		}
		if rec.Code >= 300 && len(a.Transfers()) != 0 {
			t.Fatalf("%s answered %d but left a transfer: %+v", req.URL.Path, rec.Code, a.Transfers())
		}
	})
}
