package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/controlplane/store"
)

// HTTPLender is the default Lender: it calls the agent's lease-execution API
// at node.AgentURL with the node's agent key as bearer token.
type HTTPLender struct {
	hc *http.Client
}

// NewHTTPLender returns a Lender using hc (nil: a client with pooled
// keep-alive connections; deadlines come from the caller's context).
func NewHTTPLender(hc *http.Client) *HTTPLender {
	if hc == nil {
		tr := &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}
		hc = &http.Client{Transport: tr}
	}
	return &HTTPLender{hc: hc}
}

// lenderBufs holds the buffers lender answers are read into.
var lenderBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Prepare asks the lender to prepare an export.
func (h *HTTPLender) Prepare(ctx context.Context, node api.Node, agentKey string, req api.PrepareRequest) (api.PrepareResponse, error) {
	var out api.PrepareResponse
	err := h.post(ctx, node, agentKey, "/agent/v1/prepare", req, &out)
	if err == nil && out.URI == "" {
		err = fmt.Errorf("controlplane: agent %s confirmed without a URI", node.ID)
	}
	return out, err
}

// Teardown asks the lender to stop serving a lease.
func (h *HTTPLender) Teardown(ctx context.Context, node api.Node, agentKey string, leaseID string) error {
	return h.post(ctx, node, agentKey, "/agent/v1/teardown", api.TeardownRequest{LeaseID: leaseID}, nil)
}

func (h *HTTPLender) post(ctx context.Context, node api.Node, agentKey, path string, in, out any) error {
	if node.AgentURL == "" {
		return fmt.Errorf("controlplane: node %s has no agent URL", node.ID)
	}
	// The request body is not pooled: the transport may still read it
	// after Do returns.
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("controlplane: encode %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(node.AgentURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("controlplane: agent %s: %w", node.ID, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+agentKey)
	resp, err := h.hc.Do(req)
	if err != nil {
		return fmt.Errorf("controlplane: agent %s %s: %w", node.ID, path, err)
	}
	defer resp.Body.Close()
	buf := lenderBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 64<<10 {
			lenderBufs.Put(buf)
		}
	}()
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, 1<<20)); err != nil {
		return fmt.Errorf("controlplane: agent %s %s: %w", node.ID, path, err)
	}
	data := buf.Bytes()
	if resp.StatusCode/100 != 2 {
		msg := strings.TrimSpace(string(data))
		var eb api.ErrorBody
		if json.Unmarshal(data, &eb) == nil && eb.Error.Message != "" {
			msg = eb.Error.Code + ": " + eb.Error.Message
		}
		if len(msg) > 200 {
			msg = msg[:200]
		}
		return fmt.Errorf("controlplane: agent %s %s: %s: %s", node.ID, path, resp.Status, msg)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("controlplane: agent %s %s: decode: %w", node.ID, path, err)
		}
	}
	return nil
}

// nodeCache keeps the node records lender calls need (address, agent key,
// state), so that a lease cycle does not read and decode its lenders'
// rows every time. It is dropped by invalidate, which every join, rejoin
// and liveness change calls.
type nodeCache struct {
	mu  sync.Mutex
	gen uint64
	m   map[string]store.NodeRecord
}

// nodeRecord returns a node's record, from the cache when it has it.
func (s *Server) nodeRecord(ctx context.Context, id string) (store.NodeRecord, error) {
	c := &s.nodes
	c.mu.Lock()
	n, ok := c.m[id]
	gen := c.gen
	c.mu.Unlock()
	if ok {
		return n, nil
	}
	n, err := s.st.Node(ctx, id)
	if err != nil {
		return n, err
	}
	c.mu.Lock()
	if c.gen == gen {
		if c.m == nil {
			c.m = map[string]store.NodeRecord{}
		}
		c.m[id] = n
	}
	c.mu.Unlock()
	return n, nil
}
