package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/dataplane/accel"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
)

func TestHTTP(t *testing.T) {
	echo, _ := roles.New(context.Background(), roles.Spec{Name: "echo"})
	g := run(t, Config{Name: "h", MaxBatch: 4}, Local(echo))
	auth := func(c []byte) error {
		if string(c) != "lease" {
			return errors.New("no")
		}
		return nil
	}
	srv := httptest.NewServer(g.Handler(auth))
	defer srv.Close()
	post := func(entry, cred, body string) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/call/"+entry, strings.NewReader(body))
		req.Header.Set("Rialto-Lease-Credential", cred)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := post("echo", "lease", "hello"); status != 200 || body != "hello" {
		t.Fatalf("call: %d %q", status, body)
	}
	if status, body := post("echo", "nope", "x"); status != 403 || !strings.Contains(body, "credential_rejected") {
		t.Fatalf("bad credential: %d %s", status, body)
	}
	if status, body := post("nope", "lease", "x"); status != 404 || !strings.Contains(body, "unknown_entry") {
		t.Fatalf("unknown entry: %d %s", status, body)
	}
	resp, err := http.Get(srv.URL + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"executions":`) {
		t.Fatalf("stats %s", b)
	}
	// The rejections map to HTTP statuses.
	for _, tc := range []struct {
		err    error
		status int
	}{{ErrQueueFull, 429}, {ErrStopped, 503}, {ErrGroupTooBig, 413}, {accel.ErrAuth, 403}} {
		rec := httptest.NewRecorder()
		httpError(rec, tc.err)
		if rec.Code != tc.status {
			t.Errorf("%v: %d, want %d", tc.err, rec.Code, tc.status)
		}
	}
}
