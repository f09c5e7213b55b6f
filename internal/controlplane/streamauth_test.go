package controlplane

import (
	"bufio"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
)

// streamReader reads an ndjson event stream opened with openStream.
type streamReader struct {
	t    *testing.T
	name string
	sc   *bufio.Scanner
}

func openFollow(t *testing.T, e *env, name, token string) *streamReader {
	t.Helper()
	return openFollowAt(t, e, name, "/v1/events?follow=1&since=end&format=ndjson", token)
}

// openFollowAt opens the stream at path: the API's (ndjson) or one that
// passes it on as Server-Sent Events (Redfish's), whose id: lines next
// reads.
func openFollowAt(t *testing.T, e *env, name, path, token string) *streamReader {
	t.Helper()
	resp := openStream(t, e.ctx(), e.ts.URL+path, token)
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("%s: follow: status %d", name, resp.StatusCode)
	}
	return &streamReader{t: t, name: name, sc: bufio.NewScanner(resp.Body)}
}

// next returns the stream's next event, or ok false when the stream
// ended. Keep-alives (blank lines) are skipped.
func (r *streamReader) next() (api.Event, bool) {
	r.t.Helper()
	for r.sc.Scan() {
		line := r.sc.Text()
		if id, ok := strings.CutPrefix(line, "id: "); ok {
			n, err := strconv.ParseInt(id, 10, 64)
			if err != nil {
				r.t.Fatalf("%s: %q: %v", r.name, line, err)
			}
			return api.Event{ID: n}, true
		}
		if line == "" || !strings.HasPrefix(line, "{") {
			continue // keep-alives, SSE's retry:, data: and comments
		}
		var ev api.Event
		if err := json.Unmarshal(r.sc.Bytes(), &ev); err != nil {
			r.t.Fatalf("%s: %q: %v", r.name, r.sc.Text(), err)
		}
		return ev, true
	}
	return api.Event{}, false
}

// TestRevokedStreamsEnd: an open event stream (GET /v1/events?follow=1,
// which the dashboard's and Redfish's streams are) is the caller's as
// long as its token is: a tenant token taken out by a reload, a token
// whose admin flag a reload took away (its view would shrink) and a
// removed node's credential end their streams, which deliver nothing
// appended after the change; a token kept keeps its stream.
func TestRevokedStreamsEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) {
		c.Tokens = append(c.Tokens, Token{Token: "carol-secret-token", Tenant: "carol", Admin: true})
	})
	e.srv.events.interval = 10 * time.Millisecond
	j, _ := e.join("n1", 1<<30)
	kept := openFollow(t, e, "admin", adminTok)
	alice := openFollow(t, e, "alice (token taken out)", aliceTok)
	carol := openFollow(t, e, "carol (admin flag taken away)", "carol-secret-token")
	removed := openFollow(t, e, "n1 (node removed)", j.Credential)
	redfish := openFollowAt(t, e, "alice's Redfish EventService stream", "/redfish/v1/EventService/SSE", aliceTok)

	// Every stream is live: each gets an event appended now.
	first := e.appendEvents(1, "test.before")[0]
	for _, r := range []*streamReader{kept, alice, carol, removed, redfish} {
		if ev, ok := r.next(); !ok || ev.ID != first.ID {
			t.Fatalf("%s: got %+v (open %v), want event %d", r.name, ev, ok, first.ID)
		}
	}

	if err := e.srv.Reload(e.ctx(), Settings{BootstrapToken: bootTok, Tokens: []Token{
		{Token: bobTok, Tenant: "bob"}, {Token: adminTok, Tenant: "ops", Admin: true}, {Token: "carol-secret-token", Tenant: "carol"},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RemoveNode(e.ctx(), j.NodeID, true); err != nil {
		t.Fatal(err)
	}
	after := e.appendEvents(1, "test.after")[0]
	for {
		ev, ok := kept.next()
		if !ok {
			t.Fatal("admin: a kept token's stream ended")
		}
		if ev.ID == after.ID {
			break
		}
	}
	for _, r := range []*streamReader{alice, carol, removed, redfish} {
		for {
			ev, ok := r.next()
			if !ok {
				break
			}
			if ev.ID >= after.ID {
				t.Fatalf("%s: the stream delivered event %d (%s), appended after the change", r.name, ev.ID, ev.Type)
			}
		}
	}
	// A reconnection is refused.
	for _, tok := range []string{aliceTok, j.Credential} {
		resp := openStream(t, e.ctx(), e.ts.URL+"/v1/events?follow=1", tok)
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("a revoked token follows again: status %d", resp.StatusCode)
		}
	}
}
