package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Failover: a Client given several control-plane addresses
// ("http://a:7070,http://b:7070", as RIALTO_ADDR may hold) sends each
// request to the address that answered last, and moves on to the next
// when a request cannot be delivered or answered (connection refused,
// reset or cut before the answer; a timeout), is answered 503 (the
// replica cannot reach its database, or is shutting down) or 502 or 504
// (a proxy's), or is answered a plain 400, one whose body is not the
// API's error body (an HTTPS replica given as http://: "Client sent an
// HTTP request to an HTTPS server"), which says nothing of the request
// itself; a 400 of the API's is the request's, and final. It goes round
// the list at most failoverRounds times, waiting failoverBackoff (growing)
// between rounds, within the request's context. A retried request may
// have been carried out by the replica that failed to answer: lease
// creations therefore always carry an idempotency key when there are
// several addresses (CreateLease makes one up), renewals are idempotent,
// and a retried release that finds the lease released answers with it.
// With one address a Client never retries.
//
// The placement leader: replicas sharing a PostgreSQL store let one of
// them (the placement leader) place every lease, and forward lease
// creations and releases that reach another replica to it. The leader
// names itself in the answers to those calls (PlacementLeaderHeader, also
// when the answer was forwarded); a Client with several addresses then
// sends its creations and releases straight to that address, saving the
// forwarding hop, provided it is one of the Client's own addresses (a
// credential never goes to an address the Client was not given). When the
// leader cannot be reached or answers 503, or answers without naming
// itself (it no longer leads), the Client forgets it and goes through its
// list as above.

// PlacementLeaderHeader, in the answer to a lease creation or release,
// is the API address (as advertised to the other replicas) of the
// control-plane replica that places leases.
const PlacementLeaderHeader = "Rialto-Placement-Leader"

// failoverRounds is how many times a request goes round the address list.
const failoverRounds = 3

// failoverBackoff is the wait before the second round (doubled after).
var failoverBackoff = 200 * time.Millisecond

// endpoints is a list of control-plane base URLs and the one in use,
// shared by the Clients made for the same list (so an agent that makes a
// Client per heartbeat remembers where it failed over to).
type endpoints struct {
	bases []string
	cur   atomic.Int32
	// leader is 1 + the index of the placement leader's address, 0 when
	// it is not known.
	leader atomic.Int32
}

var endpointSets sync.Map // the list as given → *endpoints

func newEndpoints(list string) *endpoints {
	if v, ok := endpointSets.Load(list); ok {
		return v.(*endpoints)
	}
	e := &endpoints{}
	for _, b := range strings.Split(list, ",") {
		if b = strings.TrimRight(strings.TrimSpace(b), "/"); b != "" {
			e.bases = append(e.bases, b)
		}
	}
	if len(e.bases) == 0 {
		e.bases = []string{""}
	}
	v, _ := endpointSets.LoadOrStore(list, e)
	return v.(*endpoints)
}

func (e *endpoints) current() (int, string) {
	i := int(e.cur.Load()) % len(e.bases)
	return i, e.bases[i]
}

// failed moves past address i (unless another request already did).
func (e *endpoints) failed(i int) {
	e.cur.CompareAndSwap(int32(i), int32((i+1)%len(e.bases)))
}

// noteLeader remembers the placement leader named in resp (or forgets
// it when none is named, or one outside the list).
func (e *endpoints) noteLeader(resp *http.Response) {
	i := 0
	if h := strings.TrimRight(resp.Header.Get(PlacementLeaderHeader), "/"); h != "" {
		for k, b := range e.bases {
			if b == h {
				i = k + 1
				break
			}
		}
	}
	if int(e.leader.Load()) != i {
		e.leader.Store(int32(i))
	}
}

// Addresses returns the control-plane addresses the Client uses.
func (c *Client) Addresses() []string { return append([]string(nil), c.ep.bases...) }

// shouldFailOver reports whether a request that got err (a transport
// error) or resp should go to the next address. Of a 400 it reads the
// body (plainBadRequest), and puts back what it read.
func shouldFailOver(ctx context.Context, err error, resp *http.Response) bool {
	if ctx.Err() != nil {
		return false
	}
	if err == nil {
		switch resp.StatusCode {
		case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
			return true
		case http.StatusBadRequest:
			return plainBadRequest(resp)
		}
		return false
	}
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) ||
		strings.Contains(err.Error(), "server closed") || strings.Contains(err.Error(), "connection reset")
}

// plainBadRequest reports whether resp, a 400, is a plain one: its body
// is not the API's error body (ErrorOf would make it Plain). It reads the
// body (at most 1 MiB, as ErrorOf does) and puts back what it read before
// the rest.
func plainBadRequest(resp *http.Response) bool {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body = rereadBody{Reader: io.MultiReader(bytes.NewReader(data), resp.Body), Closer: resp.Body}
	_, ok := apiErrorBody(data)
	return !ok
}

// rereadBody is an answer's body, its start read already put back.
type rereadBody struct {
	io.Reader
	io.Closer
}

// roundTrip sends the request that mk builds for a base URL, failing over
// as the package comment says; toLeader: the request goes to the
// placement leader first, if known.
func (c *Client) roundTrip(ctx context.Context, toLeader bool, mk func(base string) (*http.Request, error)) (*http.Response, error) {
	n := len(c.ep.bases)
	if n == 1 {
		req, err := mk(c.ep.bases[0])
		if err != nil {
			return nil, err
		}
		return c.hc.Do(req)
	}
	if li := c.ep.leader.Load(); toLeader && li > 0 {
		req, err := mk(c.ep.bases[li-1])
		if err != nil {
			return nil, err
		}
		resp, err := c.hc.Do(req)
		if !shouldFailOver(ctx, err, resp) {
			if err == nil {
				c.ep.noteLeader(resp)
			}
			return resp, err
		}
		// Forget it; the list's replicas forward to the new one.
		c.ep.leader.CompareAndSwap(li, 0)
		if err == nil {
			resp.Body.Close()
		}
	}
	backoff := failoverBackoff
	var lastErr error
	var last *http.Response
	for round := 0; round < failoverRounds; round++ {
		if round > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				if last != nil {
					return last, nil
				}
				return nil, lastErr
			case <-t.C:
			}
			backoff *= 2
		}
		for k := 0; k < n; k++ {
			i, base := c.ep.current()
			req, err := mk(base)
			if err != nil {
				return nil, err
			}
			resp, err := c.hc.Do(req)
			if !shouldFailOver(ctx, err, resp) {
				if last != nil {
					last.Body.Close()
				}
				if toLeader && err == nil {
					c.ep.noteLeader(resp)
				}
				return resp, err
			}
			c.ep.failed(i)
			if last != nil {
				last.Body.Close()
				last = nil
			}
			if err == nil {
				// Keep the answer (a 503, a plain 400) to return if every
				// address fails; read it now so that its connection can be
				// reused.
				data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
				resp.Body = io.NopCloser(strings.NewReader(string(data)))
				last, lastErr = resp, nil
			} else {
				last, lastErr = nil, err
			}
		}
	}
	if last != nil {
		return last, nil
	}
	return nil, lastErr
}

// newIdempotencyKey makes up a key for a create that may be retried on
// another replica.
func newIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:])
	return "auto-" + hex.EncodeToString(b[:])
}

// Unanswered reports whether err is that of a request the control plane
// did not answer: it could not be reached (connection refused, no route,
// a name not resolved), the connection broke before the answer, the
// request timed out, or a proxy in front of it answered 502 or 504. An
// idempotent request (a creation with an idempotency key, a renewal, a
// release) may be sent again. Not an answer of the control plane's, an
// untrusted certificate, nor a cancelled request. (A request whose
// context's deadline passed is unanswered: the caller that retries checks
// its own context.)
func Unanswered(err error) bool {
	if err == nil || errors.Is(err, ErrUntrustedServer) || errors.Is(err, context.Canceled) {
		return false
	}
	var ae *Error
	if errors.As(err, &ae) {
		return ae.Status == http.StatusBadGateway || ae.Status == http.StatusGatewayTimeout
	}
	var op *net.OpError
	var ne net.Error
	return errors.As(err, &op) || errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
