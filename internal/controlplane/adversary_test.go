package controlplane

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// This file holds the probes of an adversarial review of the API (a
// tenant or an agent trying what it should not): each sends what a
// hostile or careless client would, over a real socket, and checks the
// answer and that nothing changed.

// raw sends a request with token tok (none when empty) and returns the
// answer's status and body.
func (e *env) raw(tok, method, path, body string, hdr ...string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx(), method, e.ts.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// errorOf decodes an API error body.
func errorOf(t *testing.T, body string) api.ErrorInfo {
	t.Helper()
	var eb api.ErrorBody
	if err := json.Unmarshal([]byte(body), &eb); err != nil {
		t.Fatalf("not an error body: %v: %q", err, body)
	}
	return eb.Error
}

// TestHostileLeaseRequests: sizes, stripe units and deadlines at the
// edge of their types, and oversized labels, are refused with a 400 that
// says which field is wrong, before anything is placed or written. A size
// near the int64 limit used to overflow placement's rounding into a part
// of negative length, which the store refused again and again until the
// creation answered 503 "devices kept being taken by concurrent leases";
// a huge deadline overflowed into a "negative deadline".
func TestHostileLeaseRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 64<<30)
	e.join("n2", 64<<30)
	before, err := e.admin.Events(e.ctx(), 0)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 100000)
	for _, c := range []struct{ body, want string }{
		{`{"kind":"block","size":9223372036854775807}`, "size"},
		{`{"kind":"block","size":9223372036854771712}`, "size"},
		{`{"kind":"memory","size":9223372036854775807}`, "size"},
		{`{"kind":"block","mode":"composed","count":2,"size":9223372036854775807}`, "size"},
		{`{"kind":"block","mode":"composed","count":64,"size":1048576,"stripe_unit":4611686018427387904}`, "stripe_unit"},
		{`{"kind":"block","size":1048576,"work":1048576,"deadline_seconds":1e300}`, "deadline_seconds"},
		{`{"kind":"block","size":1048576,"labels":{"` + long + `":"y"}}`, "label"},
		{`{"kind":"block","size":1048576,"labels":{"k":"` + long + `"}}`, "label"},
		{`{"kind":"block","size":1048576,"labels":{"":"y"}}`, "label"},
		{`{"kind":"block","size":1048576,"affinity":["` + long + `"]}`, "affinity"},
	} {
		for _, path := range []string{"/v1/leases", "/v1/explain"} {
			code, body := e.raw(aliceTok, "POST", path, c.body)
			if code != http.StatusBadRequest {
				t.Errorf("POST %s %.90s: %d %.300s; want 400", path, c.body, code, body)
				continue
			}
			if info := errorOf(t, body); info.Code != api.CodeInvalid || !strings.Contains(info.Message, c.want) {
				t.Errorf("POST %s %.90s: %+v; want %s naming %q", path, c.body, info, api.CodeInvalid, c.want)
			}
		}
	}
	if ls, err := e.alice.Leases(e.ctx()); err != nil || len(ls) != 0 {
		t.Errorf("alice's leases after refused requests: %v, %v", ls, err)
	}
	after, err := e.admin.Events(e.ctx(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("refused requests wrote %d event(s): %+v", len(after)-len(before), after[len(before):])
	}
	// The largest size allowed is refused for room, as any other too
	// large a lease: 422, not 400 or 503.
	code, body := e.raw(aliceTok, "POST", "/v1/leases", fmt.Sprintf(`{"kind":"block","size":%d}`, int64(maxLeaseSize)))
	if code != http.StatusUnprocessableEntity {
		t.Errorf("size %d: %d %s; want 422", int64(maxLeaseSize), code, body)
	}
}

// TestStreamsPerToken: one token may hold maxFollowersPerCaller event
// streams; its next is 429 while other tenants still get theirs. Before,
// only the server-wide bound (4096) held, so one tenant could take every
// stream and lock every other tenant, the admin and the dashboard out.
func TestStreamsPerToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(e.ctx())
	defer cancel()
	var open []*http.Response
	defer func() {
		cancel()
		for _, r := range open {
			r.Body.Close()
		}
	}()
	for i := range maxFollowersPerCaller {
		resp := openStream(t, ctx, e.ts.URL+"/v1/events?follow=1&since=end", bobTok)
		open = append(open, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("bob's stream %d: %d", i, resp.StatusCode)
		}
	}
	resp := openStream(t, ctx, e.ts.URL+"/v1/events?follow=1&since=end", bobTok)
	if resp.StatusCode == http.StatusOK {
		resp.Body.Close() // a stream: its body does not end
		t.Fatalf("bob's stream %d: 200; want 429", maxFollowersPerCaller+1)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("bob's stream %d: %d %s; want 429", maxFollowersPerCaller+1, resp.StatusCode, body)
	}
	if info := errorOf(t, string(body)); info.Code != api.CodeQuota || !strings.Contains(info.Message, "event streams") {
		t.Errorf("refusal: %+v", info)
	}
	for _, tok := range []string{aliceTok, adminTok} {
		resp := openStream(t, ctx, e.ts.URL+"/v1/events?follow=1&since=end", tok)
		open = append(open, resp)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("another token's stream while bob holds %d: %d", maxFollowersPerCaller, resp.StatusCode)
		}
	}
}

// TestSlowBody: a client that sends its headers and then its body slowly
// (or never) is answered 400 once Config.BodyTimeout has passed, and its
// connection is closed; before, only the headers had a deadline
// (http.Server.ReadHeaderTimeout) and such a client held a connection and
// a handler as long as it liked (slowloris).
func TestSlowBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.BodyTimeout, c.PrepareTimeout = 200*time.Millisecond, time.Second })
	for _, tc := range []struct{ name, head, body string }{
		{"content-length", "Content-Length: 100\r\n", `{"kind":`},
		{"chunked", "Transfer-Encoding: chunked\r\n", "8\r\n{\"kind\":\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", e.ts.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// A bound on the test, not a synchronisation: the server
			// answers within BodyTimeout.
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(conn, "POST /v1/leases HTTP/1.1\r\nHost: rialto\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%s\r\n%s", aliceTok, tc.head, tc.body)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer to a body that never ends: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "did not arrive within 200ms") {
				t.Fatalf("%d %s; want 400 saying the body did not arrive", resp.StatusCode, b)
			}
		})
	}
	// A body that arrives in time, then a handler that outlives the
	// timeout (its lender does not answer; PrepareTimeout is 1s), gets
	// its own answer: the deadline went with the body.
	jr, _ := e.join("n1", 1<<30)
	e.lender.set(e.lender.hang, jr.NodeID, true)
	_, err := e.alice.CreateLease(e.ctx(), api.LeaseRequest{Kind: api.KindBlock, Size: 1 << 20})
	if !api.IsCode(err, api.CodeUnavailable) || !strings.Contains(err.Error(), "no confirmation") {
		t.Fatalf("a creation whose lender hangs: %v; want 503 naming the lender", err)
	}
}

// TestDuplicateKeys: a body that names a field twice — also in another
// case, which encoding/json takes for the same field — is 400 and changes
// nothing; before, the last one silently won ({"kind":"block",
// "kind":"memory"} asked for memory). Nested objects and arrays of objects
// may repeat their keys across elements.
func TestDuplicateKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.join("n1", 64<<30)
	for _, b := range []string{
		`{"kind":"block","size":1048576,"kind":"memory"}`,
		`{"kind":"block","size":1048576,"Kind":"memory"}`,
		`{"kind":"block","size":1048576,"labels":{"a":"1","a":"2"}}`,
		`{"kind":"block","size":1048576,"ttl_seconds":60,"TTL_Seconds":3600}`,
	} {
		code, body := e.raw(aliceTok, "POST", "/v1/leases", b)
		if code != http.StatusBadRequest || !strings.Contains(errorOf(t, body).Message, "duplicate key") {
			t.Errorf("%s: %d %.200s; want 400 duplicate key", b, code, body)
		}
	}
	if ls, err := e.alice.Leases(e.ctx()); err != nil || len(ls) != 0 {
		t.Errorf("alice's leases after refused requests: %d, %v", len(ls), err)
	}
	// The same keys in different objects are no duplicates.
	code, body := e.raw(aliceTok, "POST", "/v1/explain", `{"kind":"block","size":1048576,"labels":{},"affinity":[],"role_config":null}`)
	if code != http.StatusOK {
		t.Errorf("a body without duplicates: %d %s", code, body)
	}
	code, body = e.raw(adminTok, "PUT", "/v1/profiles/m1", `{"model":"m1","write_bps":[1,2],"read_bps":[1,2]}`)
	if code != http.StatusOK {
		t.Errorf("a profile without duplicates: %d %s", code, body)
	}
	code, body = e.raw(adminTok, "PUT", "/v1/profiles/m1", `{"model":"m1","write_bps":[1,2],"read_bps":[1,2],"write_bps":[5]}`)
	if code != http.StatusBadRequest {
		t.Errorf("a profile with a duplicate: %d %s", code, body)
	}
}

// TestRedfishSessionsPerToken: one token may open 64 Redfish sessions;
// its next login is 429 while another tenant still logs in. Before, only
// the process-wide bound (10000) held, which one tenant could fill.
func TestRedfishSessionsPerToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	login := func(tok string) (int, string) {
		return e.raw("", "POST", "/redfish/v1/SessionService/Sessions", `{"UserName":"u","Password":"`+tok+`"}`)
	}
	for i := range 64 {
		if code, body := login(bobTok); code != http.StatusCreated {
			t.Fatalf("bob's session %d: %d %s", i, code, body)
		}
	}
	if code, body := login(bobTok); code != http.StatusTooManyRequests || !strings.Contains(body, "SessionLimitExceeded") {
		t.Fatalf("bob's session 65: %d %.300s; want 429 SessionLimitExceeded", code, body)
	}
	if code, body := login(aliceTok); code != http.StatusCreated {
		t.Fatalf("alice's session while bob holds 64: %d %s", code, body)
	}
}

// TestLoginLinksPerToken: a tenant asking for login links again and again
// replaces only its own oldest; another tenant's pending link still signs
// in. Before, the 1024 links kept in all were shared: the 1024th of one
// tenant's links evicted the oldest pending link of anyone.
func TestLoginLinksPerToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	link, err := e.alice.LoginLink(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second) // alice's link is the oldest (it has 10 minutes)
	for i := range 1100 {
		if _, err := e.bob.LoginLink(e.ctx()); err != nil {
			t.Fatalf("bob's link %d: %v", i, err)
		}
	}
	code, body := e.raw("", "GET", link.Path, "")
	if code != http.StatusOK || !strings.Contains(body, "Signed in") {
		t.Fatalf("alice's link after bob asked for 1100: %d %.300s", code, body)
	}
}
