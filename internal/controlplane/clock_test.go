package controlplane

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/clock"
)

// fakeEnv is an env whose server schedules everything on a clock.Fake:
// nothing it times happens until the test advances the clock.
func fakeEnv(t *testing.T) (*env, *clock.Fake) {
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	e := newEnv(t, func(c *Config) { c.Clock, c.HeartbeatInterval = fake, time.Second })
	return e, fake
}

// Run sweeps at every tick of its clock: a node silent past SuspectAfter
// becomes suspect, then down past DownAfter, with no Sweep called.
func TestRunSweepsOnItsClock(t *testing.T) {
	t.Parallel()
	e, fake := fakeEnv(t)
	j, _ := e.join("n1", 1<<30)
	ctx, cancel := context.WithCancel(e.ctx())
	done := make(chan error, 1)
	go func() { done <- e.srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Run: %v", err)
		}
	}()
	if err := fake.BlockUntil(ctx, 2); err != nil { // Run's sweep ticker and its liveness flush ticker
		t.Fatal(err)
	}
	for _, c := range []struct {
		advance time.Duration
		want    api.NodeState
	}{
		{4 * time.Second, api.NodeSuspect}, // silent 4s > 3s
		{7 * time.Second, api.NodeDown},    // silent 11s > 10s
	} {
		for range int(c.advance / time.Second) {
			fake.Advance(time.Second)
		}
		pollState(t, e, j.NodeID, c.want)
	}
}

// pollState waits (with a deadline) until node id is in state want: the
// sweep a tick started runs on Run's goroutine.
func pollState(t *testing.T, e *env, id string, want api.NodeState) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := e.admin.Node(e.ctx(), id)
		if err != nil {
			t.Fatal(err)
		}
		if n.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s is %s, want %s", id, n.State, want)
		}
		<-tick.C
	}
}

// The event stream polls the store on the server's clock and sends a
// keep-alive after keepaliveInterval of the clock's idle time.
func TestStreamOnItsClock(t *testing.T) {
	t.Parallel()
	e, fake := fakeEnv(t)
	ctx, cancel := context.WithTimeout(e.ctx(), 30*time.Second)
	defer cancel()
	resp := openStream(t, ctx, e.ts.URL+"/v1/events?follow=1&format=sse", adminTok)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	// readBlock reads up to the blank line that ends an SSE block.
	readBlock := func() string {
		t.Helper()
		var b strings.Builder
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("stream: %v after %q", err, b.String())
			}
			if line == "\n" {
				return b.String()
			}
			b.WriteString(line)
		}
	}
	if got := readBlock(); got != "retry: 1000\n" {
		t.Fatalf("preamble %q", got)
	}
	// The tailer's ticker, and the stream's idle timer and caller
	// recheck timer: the tailer starts its ticker on its own goroutine,
	// which may come after the stream's two timers.
	if err := fake.BlockUntil(ctx, 3); err != nil {
		t.Fatal(err)
	}
	ev := e.appendEvents(1, "test.clock")[0]
	fake.Advance(e.srv.events.pollInterval())
	got := readBlock()
	var sent api.Event
	if _, data, ok := strings.Cut(got, "data: "); !ok || json.Unmarshal([]byte(data), &sent) != nil || sent.ID != ev.ID {
		t.Fatalf("after one poll interval the stream sent %q, want event %d", got, ev.ID)
	}
	// The stream resets its idle timer after sending; the test cannot
	// tell the old timer from the new one, so it advances by whole
	// keep-alive intervals until the stream speaks: nothing but the idle
	// timer makes it send a keep-alive.
	got = ""
	block := make(chan string, 1)
	go func() {
		var b strings.Builder
		for {
			line, err := r.ReadString('\n')
			if err != nil || line == "\n" {
				block <- b.String()
				return
			}
			b.WriteString(line)
		}
	}()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for got == "" {
		fake.Advance(e.srv.events.keepaliveInterval())
		select {
		case got = <-block:
		case <-poll.C:
		case <-ctx.Done():
			t.Fatal("no keep-alive after idle intervals of the clock")
		}
	}
	if got != ": keep-alive\n" {
		t.Fatalf("after an idle keep-alive interval the stream sent %q", got)
	}
	cancel()
	_, _ = io.Copy(io.Discard, resp.Body)
}
