package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/internal/controlplane"
	"github.com/rialto-project/rialto/internal/controlplane/store/sqlite"
)

// `rialto ui` prints a one-time link that signs a browser in to the
// dashboard; it works once.
func TestUILink(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := controlplane.New(t.Context(), controlplane.Config{Store: st, Tokens: []controlplane.Token{{Token: "tok", Tenant: "ops", Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	e := func(out, errb *bytes.Buffer) *env {
		return &env{stdout: out, stderr: errb, getenv: func(k string) string {
			return map[string]string{"RIALTO_ADDR": ts.URL, "RIALTO_TOKEN": "tok"}[k]
		}}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"ui"}, e(&out, &errb)); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	link := strings.TrimSpace(out.String())
	if !strings.HasPrefix(link, ts.URL+"/ui/login?code=") {
		t.Fatalf("link %q", link)
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar}
	for i, want := range []int{http.StatusOK, http.StatusUnauthorized} {
		resp, err := hc.Get(link)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("use %d of the link: %d\n%s", i+1, resp.StatusCode, body)
		}
	}
	out.Reset()
	if code := run(context.Background(), []string{"ui", "-o", "json"}, e(&out, &errb)); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var v struct{ ID, State, URL string }
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v.State != "ok" || !strings.HasPrefix(v.URL, ts.URL+"/ui/login?code=") {
		t.Fatalf("json %s: %v", out.String(), err)
	}
}
