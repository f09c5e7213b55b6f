package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/memory/donor"
	"github.com/rialto-project/rialto/internal/dataplane/memory/protocol"
	"github.com/rialto-project/rialto/internal/pki"
)

func init() {
	builtinDrivers[api.KindMemory] = func(l *slog.Logger, _ string) Driver { return NewMemoryDriver(l) }
}

// MemoryDriver lends memory through a donor: a lease reserves an anonymous
// region reachable with the lease's export name as its credential.
type MemoryDriver struct {
	donor *donor.Donor
	tls   bool               // the donor requires TLS: URIs are rialto-mems://
	cli   func() *tls.Config // for dialling a move's rialto-mems:// destination
	track pki.TrackFunc      // registers those connections with the revocation list

	mu   sync.Mutex
	live map[string]bool
	// incoming: the parts being received (move_memory.go), by export
	// name: the transfer token their region is reached with until
	// ActivateMove.
	incoming map[string]string
}

// NewMemoryDriver returns a memory driver logging to log.
func NewMemoryDriver(log *slog.Logger) *MemoryDriver {
	return &MemoryDriver{donor: donor.New(log), live: map[string]bool{}, incoming: map[string]string{}}
}

// Ephemeral implements Ephemeral: a region lives in the agent's process,
// and a restarted agent has a fresh, zeroed one at most.
func (m *MemoryDriver) Ephemeral() string {
	return "its memory region lived in the lending agent's process, which restarted"
}

// UseTLS implements TLSUser: the donor requires TLS with the node
// certificate, and URIs are rialto-mems://; client verifies the
// destinations of moves that serve rialto-mems://, and track ends a
// move's session with one whose certificate a later revocation list
// revokes. Call it before Serve.
func (m *MemoryDriver) UseTLS(server *tls.Config, client func() *tls.Config, track pki.TrackFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cli, m.track = client, track
	if server == nil {
		return
	}
	m.donor.TLS = server
	m.tls = true
}

// Prepare reserves the region, whose requests the donor refuses from
// the export's known expiry on (e.deadline).
func (m *MemoryDriver) Prepare(_ context.Context, e Export) (api.PrepareResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	uri := protocol.URI{Address: e.Endpoint, Credential: e.Request.Export, TLS: m.tls}.String()
	if m.live[e.Request.Export] {
		if err := m.donor.SetRegionDeadline(e.Request.Export, e.deadline); err != nil {
			return api.PrepareResponse{}, err
		}
		return api.PrepareResponse{URI: uri}, nil
	}
	if err := m.donor.AddRegion(e.Request.Export, e.Request.Length); err != nil {
		return api.PrepareResponse{}, err
	}
	if err := m.donor.SetRegionDeadline(e.Request.Export, e.deadline); err != nil {
		_ = m.donor.RemoveRegion(e.Request.Export)
		return api.PrepareResponse{}, err
	}
	m.live[e.Request.Export] = true
	return api.PrepareResponse{URI: uri}, nil
}

// Teardown wipes and frees the region.
func (m *MemoryDriver) Teardown(_ context.Context, e Export) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live[e.Request.Export] {
		return nil
	}
	delete(m.live, e.Request.Export)
	cred := e.Request.Export
	if tok, ok := m.incoming[cred]; ok {
		delete(m.incoming, cred)
		cred = tok
	}
	return m.donor.RemoveRegion(cred)
}

// Suspend closes the region's connections and refuses new ones, keeping
// its memory; Resume accepts them again.
func (m *MemoryDriver) Suspend(_ context.Context, e Export) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live[e.Request.Export] {
		return nil
	}
	return m.donor.SuspendRegion(e.Request.Export)
}

// Resume serves a suspended region again.
func (m *MemoryDriver) Resume(_ context.Context, e Export) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.live[e.Request.Export] {
		return fmt.Errorf("%w: region not prepared", ErrNoDevice)
	}
	if err := m.donor.SetRegionDeadline(e.Request.Export, e.deadline); err != nil {
		return err
	}
	return m.donor.ResumeRegion(e.Request.Export)
}

// Serve runs the donor.
func (m *MemoryDriver) Serve(ctx context.Context, ln net.Listener) error {
	return m.donor.Serve(ctx, ln)
}

// Close frees every region.
func (m *MemoryDriver) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name := range m.live {
		if tok, ok := m.incoming[name]; ok {
			name = tok
		}
		m.donor.RemoveRegion(name)
	}
	m.incoming = map[string]string{}
	m.live = map[string]bool{}
	return nil
}
