package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// FollowOptions tunes FollowEvents; the zero value is fine.
type FollowOptions struct {
	// Idle is how long the stream may carry nothing, not even a
	// keep-alive, before the connection is taken for dead and opened
	// again (default 45s: three of the server's keep-alives).
	Idle time.Duration
	// Backoff is the first wait before reconnecting after an error; it
	// doubles up to 5s (default 200ms).
	Backoff time.Duration
	// Reconnected, if set, is called after the stream was opened again
	// (from the last ID delivered), with the error that ended the
	// previous connection.
	Reconnected func(err error)
}

// ErrStopFollowing, returned by FollowEvents's callback, ends it without
// an error.
var ErrStopFollowing = errors.New("rialto api: stop following")

// FollowEvents streams the audit events after since (GET
// /v1/events?follow=1, newline-delimited JSON) and calls fn with each, in
// ID order, until ctx ends (nil), fn returns an error (that error;
// ErrStopFollowing: nil) or the server refuses the request (an *Error:
// 401, 403, 400). A dropped connection is opened again from the last ID
// fn received, so fn sees every event once: no gap, no duplicate. With
// several addresses, a plain 400 (not the API's: an HTTPS replica given
// as http://) moves the stream on to the next address, as a request's
// failover does; it ends the stream once every address answered one in
// a row.
func (c *Client) FollowEvents(ctx context.Context, since int64, opt FollowOptions, fn func(Event) error) error {
	if opt.Idle <= 0 {
		opt.Idle = 45 * time.Second
	}
	if opt.Backoff <= 0 {
		opt.Backoff = 200 * time.Millisecond
	}
	hc := *c.hc
	hc.Timeout = 0 // the stream lasts; Idle bounds silence instead
	backoff := opt.Backoff
	var last error
	plain := 0 // plain 400s in a row
	for attempt := 0; ; attempt++ {
		if attempt > 0 && opt.Reconnected != nil {
			opt.Reconnected(last)
		}
		got, err := c.followOnce(ctx, &hc, &since, opt.Idle, fn)
		var cb callbackError
		if errors.As(err, &cb) {
			if errors.Is(cb.err, ErrStopFollowing) {
				return nil
			}
			return cb.err
		}
		if ctx.Err() != nil {
			return nil
		}
		var ae *Error
		isAE := errors.As(err, &ae)
		switch {
		case isAE && ae.Plain && ae.Status == http.StatusBadRequest && len(c.ep.bases) > 1:
			// followOnce moved on to the next address.
			if plain++; plain >= len(c.ep.bases) {
				return err
			}
		case isAE && ae.Status < 500:
			return err
		default:
			plain = 0
		}
		last = err
		if got {
			backoff = opt.Backoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// callbackError carries fn's error out of followOnce.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }
func (e callbackError) Unwrap() error { return e.err }

// followOnce runs one connection of FollowEvents; got reports whether it
// delivered anything.
func (c *Client) followOnce(ctx context.Context, hc *http.Client, since *int64, idle time.Duration, fn func(Event) error) (got bool, err error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	i, base := c.ep.current()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, fmt.Sprintf("%s/v1/events?follow=1&format=ndjson&since=%d", base, *since), nil)
	if err != nil {
		return false, fmt.Errorf("rialto api: %w", err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := hc.Do(req)
	if len(c.ep.bases) > 1 && shouldFailOver(ctx, err, resp) {
		c.ep.failed(i) // the next connection goes to the next replica
	}
	if err != nil {
		return false, fmt.Errorf("rialto api: follow events: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, ErrorOf(resp)
	}
	// A watchdog ends a connection that carries nothing for idle.
	alive := make(chan struct{}, 1)
	wdone := make(chan struct{})
	defer func() { <-wdone }()
	defer cancel()
	go func() {
		defer close(wdone)
		t := time.NewTimer(idle)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-alive:
				if !t.Stop() {
					<-t.C
				}
				t.Reset(idle)
			case <-t.C:
				cancel()
				return
			}
		}
	}()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			select {
			case alive <- struct{}{}:
			default:
			}
		}
		if err != nil {
			if rctx.Err() != nil && ctx.Err() == nil {
				return got, fmt.Errorf("rialto api: event stream silent for %v", idle)
			}
			return got, fmt.Errorf("rialto api: event stream: %w", err)
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue // keep-alive
		}
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return got, fmt.Errorf("rialto api: event stream: bad line: %w", err)
		}
		if ev.ID <= *since {
			continue // never deliver twice, whatever the server sends
		}
		if err := fn(ev); err != nil {
			return got, callbackError{err}
		}
		got = true
		*since = ev.ID
	}
}
