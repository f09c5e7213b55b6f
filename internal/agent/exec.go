package agent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/resource"
)

// Errors of Prepare.
var (
	// ErrConflict is returned when an export name is already used by another lease.
	ErrConflict = errors.New("agent: export already serves another lease")
	// ErrOverlap is returned when a range overlaps one that another lease's
	// export still serves (for instance a lost lease not yet torn down): the
	// agent never lets two leases reach the same bytes.
	ErrOverlap = errors.New("agent: range in use")
)

// overlapping returns the lease of a live export of another lease that
// overlaps req's range on the same device, or "".
func (a *Agent) overlapping(req api.PrepareRequest) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.exports {
		r := e.Request
		if r.LeaseID == req.LeaseID || r.DeviceName != req.DeviceName {
			continue
		}
		if r.Offset < req.Offset+req.Length && req.Offset < r.Offset+r.Length {
			return r.LeaseID
		}
	}
	return ""
}

// Prepare executes a prepare request: it checks the device and range,
// asks the kind's driver to serve the export and remembers it. Preparing
// an export again for the same lease returns the same answer.
func (a *Agent) Prepare(ctx context.Context, req api.PrepareRequest) (api.PrepareResponse, error) {
	return a.prepare(ctx, req, "", false)
}

// prepare is Prepare; prevURI, if set, is the URI the control plane was
// given for an export a previous run served (restoreExports), which the
// driver tries to serve it at again.
func (a *Agent) prepare(ctx context.Context, req api.PrepareRequest, prevURI string, report bool) (api.PrepareResponse, error) {
	if req.LeaseID == "" || req.Export == "" {
		return api.PrepareResponse{}, fmt.Errorf("%w: lease_id and export are required", ErrBadRequest)
	}
	a.mu.Lock()
	dev, ok := a.devices[req.DeviceName]
	endpoint := a.endpoints[req.Kind]
	host := a.host
	a.mu.Unlock()
	if !ok {
		return api.PrepareResponse{}, fmt.Errorf("%w: %q", ErrNoDevice, req.DeviceName)
	}
	if req.Kind == "" {
		req.Kind = dev.Kind
	}
	if req.Kind != dev.Kind {
		return api.PrepareResponse{}, fmt.Errorf("%w: device %s is %s, not %s", ErrNoDevice, dev.Name, dev.Kind, req.Kind)
	}
	if req.Offset < 0 || req.Length < 0 || req.Offset > dev.Size || req.Length > dev.Size-req.Offset {
		return api.PrepareResponse{}, fmt.Errorf("%w: offset %d length %d on %s of %d", ErrOutOfRange, req.Offset, req.Length, dev.Name, dev.Size)
	}
	if req.Length == 0 {
		req.Length = dev.Size - req.Offset
	}
	drv, ok := a.drivers[dev.Kind]
	if !ok {
		return api.PrepareResponse{}, fmt.Errorf("%w: %s", ErrNoDriver, dev.Kind)
	}

	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	old, exists := a.exports[req.Export]
	a.mu.Unlock()
	if exists && old.Request.LeaseID != req.LeaseID {
		return api.PrepareResponse{}, ErrConflict
	}
	if !exists {
		if other := a.overlapping(req); other != "" {
			// The reason reaches the requesting tenant: the other
			// lease's ID stays in this agent's log.
			a.log.Warn("refused an overlapping range", "lease", req.LeaseID, "device", dev.Name, "served_for", other)
			return api.PrepareResponse{}, fmt.Errorf("%w: the range overlaps one this agent still serves for another lease", ErrOverlap)
		}
	}
	e := Export{Request: req, Device: dev, Endpoint: endpoint, Host: host, URI: prevURI}
	if exists && prevURI == "" {
		e.URI = old.URI
	}
	resp, err := drv.Prepare(ctx, e)
	if err != nil {
		a.mPrepares.With("error").Inc()
		return api.PrepareResponse{}, fmt.Errorf("agent: prepare %s on %s: %w", req.LeaseID, dev.Name, err)
	}
	switch {
	case prevURI == "":
		// The control plane keeps this answer as the lease's URI.
		e.URI = resp.URI
	case resp.URI != prevURI || report:
		// A restored export served elsewhere keeps the URI the control
		// plane has until heartbeats have told it the new one (see
		// Heartbeat), so that a restart before then tries it again.
		e.Moved = resp.URI
	}
	a.mu.Lock()
	a.exports[req.Export] = e
	a.mExports.Set(float64(len(a.exports)))
	a.mu.Unlock()
	if err := a.saveExportsLocked(); err != nil {
		a.log.Warn("persisting exports", "err", err)
	}
	a.mPrepares.With("ok").Inc()
	a.log.Info("prepared", "lease", req.LeaseID, "device", dev.Name, "kind", dev.Kind,
		"offset", req.Offset, "length", req.Length, "export", resource.Fingerprint(req.Export))
	return resp, nil
}

// Teardown stops serving every export of a lease. An unknown lease is not
// an error.
func (a *Agent) Teardown(ctx context.Context, leaseID string) error {
	return a.teardownLease(ctx, leaseID)
}

func (a *Agent) teardownLease(ctx context.Context, leaseID string) error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	var victims []Export
	for _, e := range a.exports {
		if e.Request.LeaseID == leaseID {
			victims = append(victims, e)
		}
	}
	a.mu.Unlock()
	if len(victims) == 0 {
		return nil
	}
	var errs []error
	for _, e := range victims {
		if drv, ok := a.drivers[e.Device.Kind]; ok {
			if err := drv.Teardown(ctx, e); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		a.mu.Lock()
		delete(a.exports, e.Request.Export)
		a.mExports.Set(float64(len(a.exports)))
		a.mu.Unlock()
	}
	if err := a.saveExportsLocked(); err != nil {
		errs = append(errs, err)
	}
	a.log.Info("torn down", "lease", leaseID, "exports", len(victims))
	return errors.Join(errs...)
}

// saveExportsLocked persists the served exports; opMu must be held.
func (a *Agent) saveExportsLocked() error {
	a.mu.Lock()
	out := sortedExports(a.exports)
	a.mu.Unlock()
	return writeJSON(filepath.Join(a.cfg.StateDir, exportsFile), out)
}

// restoreExports serves again the exports persisted by a previous run, at
// the addresses they were served at when those can be bound again; the
// next heartbeat tells the control plane, which tears down those it no
// longer wants.
//
// An export that comes back at another address (its port taken by another
// process, a changed data port or advertised host) is served there; the
// agent warns, naming the lease and both addresses, counts it in
// rialto_agent_restored_exports_total{result="new_address"}, and reports
// the new URI in its heartbeats until the control plane has recorded it as
// the lease's (borrowers then get it from the lease). Until then the state
// file keeps the old URI, so a restart tries that address again. Entries
// persisted without a URI (state files of agents that did not keep them)
// are restored wherever the data planes are now.
func (a *Agent) restoreExports(ctx context.Context, saved []persistedExport) {
	for _, p := range saved {
		a.reserved.release(append(uriPorts(p.URI), uriPorts(p.Moved)...)...)
		resp, err := a.prepare(ctx, p.PrepareRequest, p.URI, p.Moved != "")
		switch {
		case err != nil:
			a.mRestored.With("failed").Inc()
			a.log.Warn("restoring an export failed; dropping it", "lease", p.LeaseID, "err", err)
		case p.URI == "":
			a.mRestored.With("unknown_address").Inc()
		case resp.URI == p.URI:
			a.mRestored.With("same_address").Inc()
		default:
			a.mRestored.With("new_address").Inc()
			a.log.Warn("restored export is served at a new address; the next heartbeat reports it to the control plane, and borrowers must fetch the lease again to reach it",
				"lease", p.LeaseID, "kind", p.Kind, "old", uriAddress(p.URI), "new", uriAddress(resp.URI))
		}
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if err := a.saveExportsLocked(); err != nil {
		a.log.Warn("persisting exports", "err", err)
	}
}

// Handler is the agent's HTTP API: POST /agent/v1/prepare and
// /agent/v1/teardown (bearer agent key), GET /agent/v1/status (bearer
// agent key), GET /agent/v1/ping (open, for RTT probes) and GET /metrics.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /agent/v1/ping", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", a.reg)
	mux.HandleFunc("POST /agent/v1/prepare", a.auth(a.handlePrepare))
	mux.HandleFunc("POST /agent/v1/teardown", a.auth(a.handleTeardown))
	mux.HandleFunc("GET /agent/v1/status", a.auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON200(w, map[string]any{"id": a.NodeID(), "state": "ready", "leases": a.Leases()})
	}))
	return mux
}

func (a *Agent) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		key := a.id.AgentKey
		a.mu.Unlock()
		if key == "" {
			writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "agent has not joined a control plane yet")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || got == "" {
			writeError(w, http.StatusUnauthorized, api.CodeUnauthorized, "missing bearer agent key")
			return
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(key)) != 1 {
			writeError(w, http.StatusUnauthorized, api.CodeUnauthorized, "wrong agent key")
			return
		}
		h(w, r)
	}
}

func (a *Agent) handlePrepare(w http.ResponseWriter, r *http.Request) {
	if a.Faults.IgnorePrepare.Load() {
		a.mPrepares.With("ignored").Inc()
		<-r.Context().Done()
		return
	}
	if a.Faults.RefusePrepare.Load() {
		a.mPrepares.With("refused").Inc()
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, ErrRefused.Error()+" (fault injected)")
		return
	}
	var req api.PrepareRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "bad prepare request: "+err.Error())
		return
	}
	resp, err := a.Prepare(r.Context(), req)
	if err != nil {
		status, code := http.StatusInternalServerError, api.CodeInternal
		switch {
		case errors.Is(err, ErrBadRequest), errors.Is(err, ErrOutOfRange):
			status, code = http.StatusBadRequest, api.CodeInvalid
		case errors.Is(err, ErrNoDevice):
			status, code = http.StatusNotFound, api.CodeNotFound
		case errors.Is(err, ErrConflict), errors.Is(err, ErrOverlap):
			status, code = http.StatusConflict, api.CodeConflict
		case errors.Is(err, ErrNoDriver):
			status, code = http.StatusServiceUnavailable, api.CodeUnavailable
		}
		writeError(w, status, code, err.Error())
		return
	}
	writeJSON200(w, resp)
}

func (a *Agent) handleTeardown(w http.ResponseWriter, r *http.Request) {
	var req api.TeardownRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil || req.LeaseID == "" {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "bad teardown request: lease_id is required")
		return
	}
	if err := a.Teardown(r.Context(), req.LeaseID); err != nil {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	writeJSON200(w, map[string]string{"id": req.LeaseID, "state": "released"})
}

// uriAddress is a data-plane URI without its path, which holds the export
// name (a secret): what may be logged.
func uriAddress(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(unparsable URI)"
	}
	u.User, u.Path, u.RawPath, u.Fragment = nil, "", "", ""
	return u.String()
}

func writeJSON200(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorInfo{Code: code, Message: msg}})
}
