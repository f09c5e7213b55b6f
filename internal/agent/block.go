package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
)

// builtinDrivers make the drivers every agent starts with; each driver's
// file registers itself.
var builtinDrivers = map[api.Kind]func(log *slog.Logger, host string) Driver{}

func init() {
	builtinDrivers[api.KindBlock] = func(l *slog.Logger, _ string) Driver { return NewBlockDriver(l) }
}

// BlockDriver lends file-backed block devices (whole or by partition) as
// NBD exports named by the lease's export name.
type BlockDriver struct {
	srv nbd.Server

	mu    sync.Mutex
	files map[string]*os.File   // backing files by path, opened once
	live  map[string]*partition // exports by name
}

// NewBlockDriver returns a block driver logging to log.
func NewBlockDriver(log *slog.Logger) *BlockDriver {
	return &BlockDriver{
		srv:   nbd.Server{Logger: log},
		files: map[string]*os.File{},
		live:  map[string]*partition{},
	}
}

// Open creates dev's backing file if absent (sparse) and extends it to
// dev.Size; a zero Size takes the file's size.
func (b *BlockDriver) Open(_ context.Context, dev DeviceConfig) (DeviceConfig, error) {
	if err := os.MkdirAll(filepath.Dir(dev.Path), 0o700); err != nil {
		return dev, err
	}
	f, err := os.OpenFile(dev.Path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return dev, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return dev, err
	}
	have := st.Size()
	if !st.Mode().IsRegular() { // a block device: its size is where it ends
		if have, err = f.Seek(0, io.SeekEnd); err != nil {
			f.Close()
			return dev, err
		}
	}
	switch {
	case dev.Size == 0:
		dev.Size = have
	case !st.Mode().IsRegular() && have < dev.Size:
		f.Close()
		return dev, fmt.Errorf("block device %s has %d bytes, fewer than the %d configured", dev.Name, have, dev.Size)
	case st.Mode().IsRegular() && st.Size() < dev.Size:
		if err := f.Truncate(dev.Size); err != nil {
			f.Close()
			return dev, err
		}
	}
	if dev.Size <= 0 {
		f.Close()
		return dev, fmt.Errorf("block device %s has no size", dev.Name)
	}
	b.mu.Lock()
	if old := b.files[dev.Path]; old != nil {
		old.Close()
	}
	b.files[dev.Path] = f
	b.mu.Unlock()
	return dev, nil
}

// Prepare adds an NBD export of the requested range.
func (b *BlockDriver) Prepare(_ context.Context, e Export) (api.PrepareResponse, error) {
	uri := "nbd://" + e.Endpoint + "/" + e.Request.Export
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.live[e.Request.Export]; ok {
		return api.PrepareResponse{URI: uri}, nil
	}
	f := b.files[e.Device.Path]
	if f == nil {
		return api.PrepareResponse{}, fmt.Errorf("%w: %s is not open", ErrNoDevice, e.Device.Name)
	}
	p := &partition{f: f, off: e.Request.Offset, size: e.Request.Length}
	ex := nbd.Export{Name: e.Request.Export, Backend: p, Description: "rialto lease " + e.Request.LeaseID}
	if e.Request.BandwidthCap > 0 || e.Request.IOPSCap > 0 {
		ex.Limit = &nbd.RateLimit{BytesPerSec: float64(e.Request.BandwidthCap), IOPS: float64(e.Request.IOPSCap)}
	}
	if err := b.srv.AddExport(ex); err != nil {
		return api.PrepareResponse{}, err
	}
	b.live[e.Request.Export] = p
	return api.PrepareResponse{URI: uri}, nil
}

// Teardown removes the export, closing its connections.
func (b *BlockDriver) Teardown(_ context.Context, e Export) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.live[e.Request.Export]; !ok {
		return nil
	}
	delete(b.live, e.Request.Export)
	return b.srv.RemoveExport(e.Request.Export)
}

// Serve runs the NBD server.
func (b *BlockDriver) Serve(ctx context.Context, ln net.Listener) error {
	return b.srv.Serve(ctx, ln)
}

// Close closes the backing files.
func (b *BlockDriver) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for name := range b.live {
		b.srv.RemoveExport(name)
	}
	b.live = map[string]*partition{}
	var first error
	for p, f := range b.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
		delete(b.files, p)
	}
	return first
}

// partition is an nbd.Backend over a byte range of a file.
type partition struct {
	f         *os.File
	off, size int64
}

func (p *partition) Size() int64 { return p.size }

func (p *partition) ReadAt(b []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(b)) > p.size {
		return 0, fmt.Errorf("agent: read beyond partition")
	}
	n, err := p.f.ReadAt(b, p.off+off)
	if n == len(b) {
		err = nil
	}
	return n, err
}

func (p *partition) WriteAt(b []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(b)) > p.size {
		return 0, fmt.Errorf("agent: write beyond partition")
	}
	return p.f.WriteAt(b, p.off+off)
}

func (p *partition) Flush() error { return p.f.Sync() }
