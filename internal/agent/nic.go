package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/nic"
	"github.com/rialto-project/rialto/internal/pki"
)

func init() {
	builtinDrivers[api.KindNIC] = func(l *slog.Logger, _ string) Driver { return NewNICDriver(l) }
}

// NICDriver lends network interfaces (docs/nic.md): a device's Path is the
// interface's name and its Size the bandwidth it lends in bytes/s. Each
// lease gets a TUN interface at the lender, its traffic leaves through the
// lent interface translated to its address, at the lease's rate: its
// BandwidthCap, else its Length (the bytes/s placement gave it), else the
// device's. One listener (the kind's endpoint) serves every lent interface.
type NICDriver struct {
	log *slog.Logger
	mux nic.Mux
	tls bool // tunnels run under TLS: URIs are rialto-nics:// (UseTLS)

	mu      sync.Mutex
	lenders map[string]*nic.Lender // by device name
}

// NewNICDriver returns a NIC driver logging to log.
func NewNICDriver(log *slog.Logger) *NICDriver {
	return &NICDriver{log: log, lenders: map[string]*nic.Lender{}}
}

// UseTLS implements TLSUser: with a server configuration the tunnels run
// under TLS with the node certificate (the lease credential's
// challenge-response inside it), and URIs are rialto-nics://. The NIC
// driver dials no data plane: client and track are unused. Call it
// before Serve.
func (d *NICDriver) UseTLS(server *tls.Config, _ func() *tls.Config, _ pki.TrackFunc) {
	if server == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mux.UseTLS(server)
	d.tls = true
}

// Open configures the lender's kernel for the interface (nftables table,
// policy routing) and reports what it reaches.
func (d *NICDriver) Open(ctx context.Context, dev DeviceConfig) (DeviceConfig, error) {
	if dev.Path == "" {
		return dev, fmt.Errorf("%w: NIC device %s names no interface", ErrConfig, dev.Name)
	}
	l, err := nic.NewLender(ctx, nic.LenderConfig{Iface: dev.Path, Rate: uint64(dev.Size) * 8, Logger: d.log})
	if err != nil {
		return dev, err
	}
	attrs := make(map[string]string, len(dev.Attributes)+3)
	maps.Copy(attrs, dev.Attributes)
	dev.Attributes = attrs
	var routes []string
	for _, p := range l.Routes() {
		routes = append(routes, p.String())
	}
	dev.Attributes["iface"] = dev.Path
	dev.Attributes["routes"] = strings.Join(routes, ",")
	dev.Attributes["bandwidth_bps"] = strconv.FormatInt(dev.Size*8, 10)
	d.mu.Lock()
	defer d.mu.Unlock()
	if old := d.lenders[dev.Name]; old != nil {
		_ = old.Close()
	}
	d.lenders[dev.Name] = l
	d.mux.Add(l)
	return dev, nil
}

// Prepare admits the lease: its TUN interface, address and rate; the
// lender drops its packets, either way, and ends its session from the
// export's known expiry on (e.deadline, nic.LeaseSpec.Deadline: in place
// before the lease takes its first HELLO, and moved by its renewals).
func (d *NICDriver) Prepare(ctx context.Context, e Export) (api.PrepareResponse, error) {
	d.mu.Lock()
	l := d.lenders[e.Device.Name]
	d.mu.Unlock()
	if l == nil {
		return api.PrepareResponse{}, fmt.Errorf("%w: NIC %s is not open", ErrNoDevice, e.Device.Name)
	}
	rate := e.Request.BandwidthCap
	if rate <= 0 {
		rate = e.Request.Length
	}
	if rate < 0 {
		return api.PrepareResponse{}, fmt.Errorf("%w: negative bandwidth", ErrBadRequest)
	}
	spec := nic.LeaseSpec{ID: e.Request.LeaseID, Credential: e.Request.Export, Rate: uint64(rate) * 8, Deadline: e.deadline}
	if err := l.AddLease(ctx, spec); err != nil {
		if errors.Is(err, nic.ErrAddr) {
			return api.PrepareResponse{}, fmt.Errorf("%w: %v", ErrRefused, err)
		}
		return api.PrepareResponse{}, err
	}
	d.mu.Lock()
	useTLS := d.tls
	d.mu.Unlock()
	return api.PrepareResponse{URI: nic.URI{Address: e.Endpoint, Credential: e.Request.Export, TLS: useTLS}.String()}, nil
}

// Teardown ends the lease's session and deletes its TUN interface.
func (d *NICDriver) Teardown(ctx context.Context, e Export) error {
	d.mu.Lock()
	l := d.lenders[e.Device.Name]
	d.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.RemoveLease(ctx, e.Request.LeaseID)
}

// Serve serves the tunnels of every lent interface.
func (d *NICDriver) Serve(ctx context.Context, ln net.Listener) error {
	return d.mux.Serve(ctx, ln)
}

// Close ends every lease and undoes the kernel configuration.
func (d *NICDriver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, l := range d.lenders {
		_ = l.Close()
		delete(d.lenders, name)
	}
	return nil
}
