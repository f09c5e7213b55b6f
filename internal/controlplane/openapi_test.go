package controlplane

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// specs caches loaded documents by their text: every test server has the
// same one, and loading it is most of a small test's time under -race.
var specs sync.Map // string → *loadedSpec

type loadedSpec struct {
	doc    *openapi3.T
	router routers.Router
}

// specFor loads a server's OpenAPI document and validates it with
// kin-openapi.
func specFor(t testing.TB, s *Server) (*openapi3.T, routers.Router) {
	t.Helper()
	if v, ok := specs.Load(string(s.openapi)); ok {
		ls := v.(*loadedSpec)
		return ls.doc, ls.router
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(s.openapi)
	if err != nil {
		t.Fatalf("openapi: load: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi: invalid document: %v", err)
	}
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatalf("openapi: router: %v", err)
	}
	specs.Store(string(s.openapi), &loadedSpec{doc, r})
	return doc, r
}

// schemaChecker is an http.RoundTripper for the API tests: it checks every
// answer of a /v1 route against the OpenAPI document (status documented,
// body matching the operation's response schema) and fails the test on a
// mismatch. Streams (SSE, NDJSON) pass unchecked: the stream tests read
// them. It counts the answers it checked per operation.
type schemaChecker struct {
	t      testing.TB
	router routers.Router
	next   http.RoundTripper

	mu      sync.Mutex
	checked map[string]int // "METHOD /path status" → answers checked
}

func newSchemaChecker(t testing.TB, s *Server, next http.RoundTripper) *schemaChecker {
	_, r := specFor(t, s)
	return &schemaChecker{t: t, router: r, next: next, checked: map[string]int{}}
}

func (c *schemaChecker) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err != nil || !strings.HasPrefix(req.URL.Path, "/v1/") {
		return resp, err
	}
	ct := resp.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "text/event-stream") || strings.HasPrefix(ct, "application/x-ndjson") {
		return resp, nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return resp, nil // the caller sees the truncated body and fails
	}
	if err := c.check(req, resp.StatusCode, resp.Header, body); err != nil {
		c.t.Errorf("openapi: %s %s → %d does not match the document: %v\nbody: %.2000s", req.Method, req.URL.RequestURI(), resp.StatusCode, err, body)
	}
	return resp, nil
}

// check validates one answer.
func (c *schemaChecker) check(req *http.Request, status int, hdr http.Header, body []byte) error {
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			return nil // no such route: the catch-all's error answer
		}
		return err
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 status,
		Header:                 hdr,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(req.Context(), in); err != nil {
		return err
	}
	c.mu.Lock()
	c.checked[req.Method+" "+route.Path+" "+strconv.Itoa(status)]++
	c.mu.Unlock()
	return nil
}

// summary lists what was checked.
func (c *schemaChecker) summary() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k := range c.checked {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestOpenAPIValid(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	specFor(t, e.srv)
}

// A profile PUT with an empty, null or curve-less body is refused and
// stores nothing (it used to store a profile of nulls that broke the
// document's schema).
func TestPutProfileRefusesEmptyBodies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	before := stateDump(t, e)
	for _, body := range []string{"", "null", " null\n", "{}", `{"model":"m1"}`, `{"write_bps":[],"read_bps":null}`} {
		req, _ := http.NewRequest("PUT", e.ts.URL+"/v1/profiles/m1", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminTok)
		resp, err := (&http.Client{Transport: e.schema}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("PUT %q: %d, want 400", body, resp.StatusCode)
		}
	}
	if ps, err := e.admin.Profiles(e.ctx()); err != nil || len(ps) != 0 {
		t.Fatalf("profiles after refused PUTs: %v %+v", err, ps)
	}
	if after := stateDump(t, e); after != before {
		t.Errorf("refused PUTs changed the state:\n%s\n%s", before, after)
	}
}

// An infeasible dry run answers "parts": [], not null.
func TestExplainInfeasiblePartsEmpty(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 1<<30)
	req, _ := http.NewRequest("POST", e.ts.URL+"/v1/explain", strings.NewReader(`{"kind":"block","size":1099511627776}`))
	req.Header.Set("Authorization", "Bearer "+aliceTok)
	resp, err := (&http.Client{Transport: e.schema}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"parts":[]`) || !strings.Contains(string(body), `"state":"infeasible"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}
