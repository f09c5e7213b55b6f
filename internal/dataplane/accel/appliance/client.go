package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/httpx"
)

// Client calls an appliance's management API (what the control plane uses
// to load roles and hand out leases).
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// NewClient returns a client for the management API at baseURL (e.g.
// "http://127.0.0.1:7480"); token may be empty; hc nil means
// http.DefaultClient.
func NewClient(baseURL, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, hc: hc}
}

// APIError is an error answer of the management API; errors.Is matches it
// against the sentinel of its code (ErrNoSlot, roles.ErrUnknownRole, ...).
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("appliance: %d %s: %s", e.Status, e.Code, e.Message)
}

// Unwrap returns the sentinel of the code.
func (e *APIError) Unwrap() error {
	return httpErrors.Sentinel(e.Code)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("appliance: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		e := httpx.ReadError(resp.Body)
		return &APIError{Status: resp.StatusCode, Code: e.Code, Message: e.Message}
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("appliance: %s %s: decode: %w", method, path, err)
	}
	return nil
}

// Info returns the appliance's registration info.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var i Info
	return i, c.do(ctx, http.MethodGet, "/v1/appliance", nil, &i)
}

// Health returns the appliance's health.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	return h, c.do(ctx, http.MethodGet, "/v1/health", nil, &h)
}

// Slots lists the slots.
func (c *Client) Slots(ctx context.Context) ([]SlotStatus, error) {
	var s []SlotStatus
	return s, c.do(ctx, http.MethodGet, "/v1/slots", nil, &s)
}

// Load loads a role into slot id.
func (c *Client) Load(ctx context.Context, id int, spec roles.Spec) (SlotStatus, error) {
	var s SlotStatus
	return s, c.do(ctx, http.MethodPut, fmt.Sprintf("/v1/slots/%d/role", id), spec, &s)
}

// Unload removes slot id's role.
func (c *Client) Unload(ctx context.Context, id int) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("/v1/slots/%d/role", id), nil, nil)
}

// Reset resets slot id.
func (c *Client) Reset(ctx context.Context, id int) error {
	return c.do(ctx, http.MethodPost, fmt.Sprintf("/v1/slots/%d/reset", id), nil, nil)
}

// SetCredential starts a lease on slot id; an empty credential ends it.
func (c *Client) SetCredential(ctx context.Context, id int, credential []byte) error {
	path := fmt.Sprintf("/v1/slots/%d/credential", id)
	if len(credential) == 0 {
		return c.do(ctx, http.MethodDelete, path, nil, nil)
	}
	return c.do(ctx, http.MethodPut, path, map[string]string{"credential": string(credential)}, nil)
}
