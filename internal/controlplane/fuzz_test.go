package controlplane

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/httpx"
)

// FuzzLeaseRequest decodes and validates arbitrary lease requests: no
// panics, and every refusal is an invalid-request error.
func FuzzLeaseRequest(f *testing.F) {
	for _, s := range []string{`{"kind":"block","size":268435456}`, `{"kind":"block","mode":"composed","count":1}`,
		`{"kind":"memory","ttl_seconds":-5}`, `{"kind":"accel","stripe_unit":3}`, `{"kind":"block","count":100000}`} {
		f.Add(s)
	}
	s := &Server{cfg: Config{MaxTTL: 24 * 3600 * 1e9}}
	f.Fuzz(func(t *testing.T, in string) {
		var r api.LeaseRequest
		if err := httpx.Decode(strings.NewReader(in), maxBody, &r); err != nil {
			return
		}
		if err := s.validateLeaseRequest(&r); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("validation error is not ErrInvalid: %v", err)
		}
		_ = requestHash(r)
	})
}

// FuzzJoinRequest validates arbitrary join requests without panicking.
func FuzzJoinRequest(f *testing.F) {
	f.Add(`{"name":"n","fingerprint":{"machine_id":"m"},"agent_url":"http://127.0.0.1:1","devices":[{"name":"d","kind":"block","capacity":1}]}`)
	f.Add(`{"name":"n","fingerprint":{"machine_id":"m"},"agent_url":"::bad"}`)
	f.Fuzz(func(t *testing.T, in string) {
		var r api.JoinRequest
		if err := httpx.Decode(strings.NewReader(in), maxBody, &r); err != nil {
			return
		}
		if err := validateJoin(r); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("validation error is not ErrInvalid: %v", err)
		}
	})
}

// TestDecodeEmpty: a body a route may omit (allowEmpty) may be empty or
// null, leaving the value as it was; any other route refuses both, and
// every route refuses what is not one strict JSON object.
func TestDecodeEmpty(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in         string
		allowEmpty bool
		ok         bool
	}{
		{`{"kind":"block","size":1}`, false, true},
		{`  `, true, true},
		{``, false, false},
		{`null`, false, false},
		{` null `, true, true},
		{`{}`, false, true},
		{`{"kind":"block"} {}`, true, false},
		{`{"kind":"block","extra":1}`, true, false},
		{`{"kind":"block","size":"x"}`, false, false},
		{`{"kind":`, false, false},
		{`[]`, true, false},
		{`{"size":1e400}`, false, false},
		{`{"kind":"` + strings.Repeat("a", maxBody) + `"}`, true, false},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/leases", strings.NewReader(c.in))
		req := api.LeaseRequest{Kind: "keep"}
		err := decode(httptest.NewRecorder(), r, c.allowEmpty, &req)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, httpx.ErrBadBody)) {
			t.Errorf("%.40q (allowEmpty %v): %v", c.in, c.allowEmpty, err)
		}
		if in := strings.TrimSpace(c.in); err == nil && (in == "" || in == "null") && req.Kind != "keep" {
			t.Errorf("%q overwrote the value: %+v", c.in, req)
		}
	}
}

// FuzzDecodeHeartbeat decodes arbitrary heartbeats: every refusal wraps
// httpx.ErrBadBody.
func FuzzDecodeHeartbeat(f *testing.F) {
	for _, s := range []string{`{"health":"ok","leases":["lease-1"],"links":[{"to":"controlplane","rtt_us":12.5,"up":true}]}`, `{"leases":null}`, `null`, ``,
		`{"health":"ok","leases":["lease-1"],"leases_complete":true,"check":"c.1","exports_complete":true,"exports":[` +
			`{"lease_id":"lease-1","device_id":"dev-1","offset":0,"length":1048576},` +
			`{"lease_id":"lease-1","device_id":"dev-1","offset":1048576,"length":1048576,"move":"move-1","uri":"nbd://10.0.0.2:10809/rlp_x"}]}`,
		`{"exports":[{"lease_id":"","offset":-1,"length":-1,"move":"","uri":"::"}],"exports_complete":false}`, `{"exports":{}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var h api.Heartbeat
		if err := httpx.Decode(strings.NewReader(in), maxHeartbeatBody, &h); err != nil && !errors.Is(err, httpx.ErrBadBody) {
			t.Fatalf("error not wrapped: %v", err)
		}
	})
}

// FuzzFollowParams reads arbitrary event-stream cursors and formats (the
// since and format query parameters, an EventSource's Last-Event-ID and
// Accept headers): no panics, every refusal is an invalid-request error,
// and a cursor accepted is the start (0), "end", or the non-negative
// integer the request gave, Last-Event-ID winning over since.
func FuzzFollowParams(f *testing.F) {
	for _, c := range [][4]string{{"12", "", "ndjson", ""}, {"", "41", "", "text/event-stream"}, {"end", "", "sse", ""},
		{"3", "end", "jsonl", ""}, {"-1", "", "", ""}, {" 7 ", "", "xml", ""}, {"9223372036854775808", "", "", ""}, {"", "0x10", "", ""}} {
		f.Add(c[0], c[1], c[2], c[3])
	}
	f.Fuzz(func(t *testing.T, since, lastID, format, accept string) {
		q := url.Values{}
		if since != "" {
			q.Set("since", since)
		}
		if format != "" {
			q.Set("format", format)
		}
		r := httptest.NewRequest(http.MethodGet, "/v1/events", nil)
		r.URL.RawQuery = q.Encode()
		if strings.ContainsAny(lastID+accept, "\r\n\x00") {
			return // not a header value a request can carry
		}
		if lastID != "" {
			r.Header.Set("Last-Event-ID", lastID)
		}
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		fm, n, err := followParams(r)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("refusal is not ErrInvalid: %v", err)
			}
			return
		}
		if fm != formatNDJSON && fm != formatSSE {
			t.Fatalf("format %d", fm)
		}
		want := since
		if v := r.Header.Get("Last-Event-ID"); v != "" {
			want = v
		}
		switch {
		case want == "":
			if n != 0 {
				t.Fatalf("no cursor read as %d", n)
			}
		case want == "end":
			if n != sinceEnd {
				t.Fatalf("end read as %d", n)
			}
		default:
			v, perr := strconv.ParseInt(strings.TrimSpace(want), 10, 64)
			if perr != nil || v < 0 || v != n {
				t.Fatalf("cursor %q read as %d", want, n)
			}
		}
	})
}

// FuzzParseQuota reads arbitrary quota specs (--quota, the config file's
// quota lines, reloaded on SIGHUP): no panics, every refusal quotes the
// spec, and an accepted quota has no negative limit and names a tenant
// without the separator.
func FuzzParseQuota(f *testing.F) {
	for _, s := range []string{"leases=10,bytes=100GiB", "acme:slots=2.5,bandwidth=1GB", "*:leases=1", ":leases=1", "t:",
		"leases=-1", "slots=NaN", "slots=1e300", "bytes=5EiB", "x=1", "leases", "t:leases=1,,bytes=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		tenant, q, err := ParseQuota(spec)
		if err != nil {
			if !strings.Contains(err.Error(), "quota "+strconv.Quote(spec)) {
				t.Fatalf("refusal does not quote the spec: %v", err)
			}
			return
		}
		if strings.Contains(tenant, ":") || tenant == "*" {
			t.Fatalf("tenant %q", tenant)
		}
		if q.Leases < 0 || q.Bytes < 0 || q.Slots < 0 || q.Bandwidth < 0 || q.Bandwidth != q.Bandwidth {
			t.Fatalf("quota %q has a negative limit: %+v", spec, q)
		}
	})
}

// FuzzCheckAgentVersion: an agent's version comes in its join request.
// No panics; a refusal wraps ErrInvalid and names both versions; an
// agent of the control plane's own version is accepted, and so is one
// that is not a release.
func FuzzCheckAgentVersion(f *testing.F) {
	for _, c := range [][2]string{{"v1.4.0", "v1.3.9"}, {"v1.4.0", "v1.5.0"}, {"v1.4.0", "v2.4.0"}, {"v1.0.0", "v1.0.0-rc1+abc"},
		{"v0.0.0-2024", "v9.9.9"}, {"devel", "v1.2.3"}, {"v1.2.3", "1.+2.3"}, {"v1.99999999999999999999.0", "v1.1.1"}, {"v1.2", "v1.2.3.4"}} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, server, agent string) {
		if err := CheckAgentVersion(server, server); err != nil {
			t.Fatalf("an agent of the control plane's version %q refused: %v", server, err)
		}
		err := CheckAgentVersion(server, agent)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), server) || !strings.Contains(err.Error(), agent) {
			t.Fatalf("unclear refusal of %q by %q: %v", agent, server, err)
		}
		if _, ok := parseRelease(agent); !ok {
			t.Fatalf("refused %q, which is not a release", agent)
		}
	})
}
