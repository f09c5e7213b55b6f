package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles/wasmtest"
)

// FuzzManagementAPI sends arbitrary bodies to the appliance's management
// API (a role to load, its config and Wasm module included; a lease
// credential) and to its HTTP call endpoint (a borrower's input), on a
// running appliance. Nothing panics; every answer that is not a success
// is a JSON error with a code; a 5xx is only a role that failed running
// (role_failed); a bad role spec leaves the slot's role as it was.
func FuzzManagementAPI(f *testing.F) {
	a, err := New(Config{Slots: 2, SlotMemory: 4096, ManagementToken: "tok", Workers: 1})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	f.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.Errorf("run: %v", err)
		}
	})
	if err := a.Load(ctx, 1, roles.Spec{Name: "echo"}); err != nil {
		f.Fatal(err)
	}
	if err := a.SetCredential(1, []byte("cred")); err != nil {
		f.Fatal(err)
	}
	h := a.Handler()
	wasm, _ := json.Marshal(roles.Spec{Name: "wasm", Module: wasmtest.EchoModule()})
	for _, c := range []struct {
		route byte
		slot  string
		body  string
	}{
		{0, "0", string(wasm)}, {0, "0", `{"name":"aesgcm","config":"AAAAAAAAAAAAAAAAAAAAAA=="}`}, {0, "0", `{"name":"aesgcm","config":"AA=="}`},
		{0, "0", `{"name":"wasm","module":"AGFzbQEAAAA=","wasm_memory_pages":4294967295}`}, {0, "0", `{"name":"mct","config":"e30="}`},
		{0, "7", `{"name":"echo"}`}, {0, "-1", `{}`}, {0, "x", `{"name":"nope"}`}, {0, "0", `{"name":"wasm","module":"!"}`},
		{1, "0", `{"credential":"c2"}`}, {1, "0", `{"credential":""}`}, {1, "0", `[]`},
		{2, "1", `hello`}, {2, "1", ``}, {2, "0", `x`}, {2, "99", `x`},
	} {
		f.Add(c.route, c.slot, []byte(c.body))
	}
	f.Fuzz(func(t *testing.T, route byte, slot string, body []byte) {
		if strings.Contains(slot, "/") {
			return // another path than the routes': the router's 404
		}
		before, _ := a.Slot(0)
		var req *http.Request
		s := url.PathEscape(slot)
		switch route % 3 {
		case 0:
			req = httptest.NewRequest(http.MethodPut, "/v1/slots/"+s+"/role", bytes.NewReader(body))
		case 1:
			req = httptest.NewRequest(http.MethodPut, "/v1/slots/"+s+"/credential", bytes.NewReader(body))
		default:
			req = httptest.NewRequest(http.MethodPost, "/v1/slots/"+s+"/call/echo", bytes.NewReader(body))
			req.Header.Set("Rialto-Lease-Credential", "cred")
		}
		req.Header.Set("Authorization", "Bearer tok")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if route%3 == 1 {
			// Slot 1 keeps the lease the calls present.
			if err := a.SetCredential(1, []byte("cred")); err != nil {
				t.Fatal(err)
			}
		}
		if rec.Code < 400 { // a success, or the mux redirecting an unclean path
			return
		}
		var eb struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" {
			t.Fatalf("%s %s answered %d without an error body: %s", req.Method, req.URL.Path, rec.Code, rec.Body)
		}
		if rec.Code >= 500 && eb.Error.Code != "role_failed" {
			t.Fatalf("%s %s answered %d: %s", req.Method, req.URL.Path, rec.Code, rec.Body)
		}
		if after, _ := a.Slot(0); route%3 == 0 && after.Role != before.Role {
			t.Fatalf("a refused role load (%d) changed slot 0's role from %+v to %+v", rec.Code, before.Role, after.Role)
		}
	})
}
