package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/accel/appliance"
	"github.com/rialto-project/rialto/internal/dataplane/accel/roles"
	"github.com/rialto-project/rialto/internal/resource"
)

func init() {
	builtinDrivers[api.KindAccel] = func(l *slog.Logger, host string) Driver { return NewAccelDriver(l, host) }
}

// DefaultSlotMemory is each accelerator slot's memory unless the device's
// "slot_memory" attribute says otherwise.
const DefaultSlotMemory = 16 << 20

// AccelDriver lends accelerator slots: each accel device is an appliance
// (internal/dataplane/accel/appliance) whose slots listen on ports of their
// own. A lease's slots accept the lease's export name as credential and
// run the requested role.
type AccelDriver struct {
	log  *slog.Logger
	host string

	mu   sync.Mutex
	apps map[string]*appliance.Appliance // by device name
	live map[string]Export               // by export name
}

// NewAccelDriver returns an accelerator driver whose slots bind host.
func NewAccelDriver(log *slog.Logger, host string) *AccelDriver {
	return &AccelDriver{log: log, host: host, apps: map[string]*appliance.Appliance{}, live: map[string]Export{}}
}

// Open builds the device's appliance with dev.Size slots.
func (d *AccelDriver) Open(_ context.Context, dev DeviceConfig) (DeviceConfig, error) {
	mem := uint64(DefaultSlotMemory)
	if s := dev.Attributes["slot_memory"]; s != "" {
		n, err := resource.ParseSize(s)
		if err != nil || n <= 0 {
			return dev, fmt.Errorf("bad slot_memory %q", s)
		}
		mem = uint64(n)
	}
	app, err := appliance.New(appliance.Config{ID: dev.Name, Slots: int(dev.Size), SlotMemory: mem, Host: d.host, Logger: d.log})
	if err != nil {
		return dev, err
	}
	if dev.Attributes == nil {
		dev.Attributes = map[string]string{}
	}
	dev.Attributes["slot_memory"] = strconv.FormatUint(mem, 10)
	dev.Attributes["roles"] = strings.Join(roles.Names(), ",")
	d.mu.Lock()
	defer d.mu.Unlock()
	if old := d.apps[dev.Name]; old != nil {
		old.Close()
	}
	d.apps[dev.Name] = app
	return dev, nil
}

// Run serves every appliance until ctx ends.
func (d *AccelDriver) Run(ctx context.Context) error {
	d.mu.Lock()
	apps := make([]*appliance.Appliance, 0, len(d.apps))
	for _, a := range d.apps {
		apps = append(apps, a)
	}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, a := range apps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Run(ctx); err != nil && ctx.Err() == nil {
				d.log.Error("appliance stopped", "err", err)
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}

// Prepare loads the role into the lease's slots and sets their credential.
// The URI names the first slot; further slots follow in a "slots" query
// parameter.
func (d *AccelDriver) Prepare(ctx context.Context, e Export) (api.PrepareResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	app := d.apps[e.Device.Name]
	if app == nil {
		return api.PrepareResponse{}, fmt.Errorf("%w: %s has no appliance", ErrNoDevice, e.Device.Name)
	}
	var addrs []string
	for i := e.Request.Offset; i < e.Request.Offset+e.Request.Length; i++ {
		a, err := app.Addr(int(i))
		if err != nil {
			return api.PrepareResponse{}, err
		}
		if _, port, err := net.SplitHostPort(a); err == nil && e.Host != "" {
			a = net.JoinHostPort(e.Host, port)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return api.PrepareResponse{}, fmt.Errorf("%w: no slots", ErrOutOfRange)
	}
	uri := "rialto-accel://" + addrs[0] + "/" + e.Request.Export
	if len(addrs) > 1 {
		uri += "?slots=" + strings.Join(addrs[1:], ",")
	}
	if _, ok := d.live[e.Request.Export]; ok {
		return api.PrepareResponse{URI: uri}, nil
	}
	for i := e.Request.Offset; i < e.Request.Offset+e.Request.Length; i++ {
		if e.Request.Role != "" {
			if err := app.Load(ctx, int(i), roles.Spec{Name: e.Request.Role}); err != nil {
				d.clear(app, e.Request.Offset, i)
				return api.PrepareResponse{}, err
			}
		}
		if err := app.SetCredential(int(i), []byte(e.Request.Export)); err != nil {
			d.clear(app, e.Request.Offset, i+1)
			return api.PrepareResponse{}, err
		}
	}
	d.live[e.Request.Export] = e
	return api.PrepareResponse{URI: uri}, nil
}

// clear ends the lease on slots [from, to) and unloads their roles.
func (d *AccelDriver) clear(app *appliance.Appliance, from, to int64) error {
	var first error
	for i := from; i < to; i++ {
		if err := app.SetCredential(int(i), nil); err != nil && first == nil {
			first = err
		}
		if err := app.Unload(context.Background(), int(i)); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Teardown closes the slots' connections, wipes their memory and unloads
// their role.
func (d *AccelDriver) Teardown(_ context.Context, e Export) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.live[e.Request.Export]; !ok {
		return nil
	}
	delete(d.live, e.Request.Export)
	app := d.apps[e.Device.Name]
	if app == nil {
		return nil
	}
	return d.clear(app, e.Request.Offset, e.Request.Offset+e.Request.Length)
}

// Close releases the appliances' listeners.
func (d *AccelDriver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, a := range d.apps {
		a.Close()
		delete(d.apps, name)
	}
	d.live = map[string]Export{}
	return nil
}
