package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// FuzzParseCursor: a ?after= cursor comes from the caller (a Link header
// it was given, or one it made up). ParseCursor never panics, refuses
// with a message that says what a cursor is, and what it accepts is a
// cursor whose text form parses back to it.
func FuzzParseCursor(f *testing.F) {
	for _, s := range []string{"", "1700000000000000000.lease-1", "0.x", "-1.x", "+5.a.b", "9223372036854775807.z",
		"-9223372036854775808.z", "1.", ".x", "x.y", "1", strings.Repeat("9", 30) + ".x", "1." + strings.Repeat("i", 257)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCursor(s)
		if err != nil {
			if !strings.Contains(err.Error(), "cursor") {
				t.Fatalf("ParseCursor(%q): unclear error %v", s, err)
			}
			return
		}
		if s == "" {
			if !c.IsZero() {
				t.Fatalf("the empty cursor is %+v, not the start", c)
			}
			return
		}
		if c.IsZero() || c.ID == "" || len(c.ID) > 256 {
			t.Fatalf("ParseCursor(%q) accepted %+v", s, c)
		}
		again, err := ParseCursor(c.String())
		if err != nil || !again.CreatedAt.Equal(c.CreatedAt) || again.ID != c.ID {
			t.Fatalf("%q parses as %+v, whose text %q parses as %+v, %v", s, c, c.String(), again, err)
		}
	})
}

// FuzzFollowStream serves arbitrary bytes as the event stream (a server or
// proxy answering GET /v1/events?follow=1) to the client's reader: it
// never panics, delivers events in increasing ID order above since and
// only once each, and ends with an error that says what went wrong.
func FuzzFollowStream(f *testing.F) {
	f.Add(int64(0), []byte("{\"id\":1,\"type\":\"node.joined\",\"subject\":\"n1\"}\n\n{\"id\":2,\"type\":\"lease.active\"}\n"))
	f.Add(int64(5), []byte("{\"id\":3}\n{\"id\":6}\n{\"id\":6}\n{\"id\":4}\n{\"id\":7,\"at\":\"2024-01-01T00:00:00Z\"}\n"))
	f.Add(int64(0), []byte("{\"id\":1}\n{\"id\":\n"))
	f.Add(int64(0), []byte("   \r\n\t\n{\"id\":9223372036854775807}\n{\"id\":1e400}\n"))
	f.Add(int64(-1), []byte("null\n[]\n\"x\"\n"))
	f.Add(int64(0), []byte("{\"id\":2}"))
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write(body)
	}))
	f.Cleanup(srv.Close)
	c := NewClient(srv.URL, "", srv.Client())
	f.Fuzz(func(t *testing.T, since int64, in []byte) {
		body = in
		last := since
		var seen int
		fn := func(ev Event) error {
			if ev.ID <= last {
				t.Fatalf("event %d delivered after %d", ev.ID, last)
			}
			last = ev.ID
			seen++
			return nil
		}
		s := since
		got, err := c.followOnce(context.Background(), srv.Client(), &s, time.Hour, fn)
		if err == nil {
			t.Fatal("a stream that ended returned no error")
		}
		if !strings.HasPrefix(err.Error(), "rialto api: event stream") {
			t.Fatalf("unclear error: %v", err)
		}
		var ae *Error
		if errors.As(err, &ae) {
			t.Fatalf("a 200 answer read as a refusal: %v", err)
		}
		if got != (seen > 0) || s != last {
			t.Fatalf("followOnce reports got %v since %d; delivered %d events, the last %d", got, s, seen, last)
		}
	})
}
