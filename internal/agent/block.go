package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"github.com/rialto-project/rialto/api"
	"github.com/rialto-project/rialto/internal/dataplane/block/nbd"
	"github.com/rialto-project/rialto/internal/dataplane/tlspsk"
	"github.com/rialto-project/rialto/internal/pki"
)

// builtinDrivers make the drivers every agent starts with; each driver's
// file registers itself.
var builtinDrivers = map[api.Kind]func(log *slog.Logger, host string) Driver{}

func init() {
	builtinDrivers[api.KindBlock] = func(l *slog.Logger, _ string) Driver { return NewBlockDriver(l) }
}

// BlockDriver lends block devices (regular files, created sparse if
// absent, or block devices), whole or by partition, as NBD exports named by
// the lease's export name. Each export is an [nbd.FileBackend] over its
// lease's range, with a descriptor of its own: zero-copy reads, FUA,
// FLUSH, TRIM (hole punching, or BLKDISCARD on a block device),
// WRITE_ZEROES (hole punching or zero range, or BLKZEROOUT) and block
// status of the lease's own range, never of its neighbours'. A lease's
// range must be a multiple of 512 bytes (the control plane aligns block
// leases to 4 KiB); a remainder is not served.
//
// BlockDriver implements [Wiper] (the agent zeroes a range before it
// returns to the pool) and [Suspender].
type BlockDriver struct {
	srv    nbd.Server
	scheme string             // of the URIs: nbd, or nbds once UseTLS is called
	cliTLS func() *tls.Config // for dialling a move's nbds:// destination (UseTLS)
	track  pki.TrackFunc      // registers those connections with the revocation list (UseTLS)

	mu    sync.Mutex
	paths map[string]bool         // backing paths opened (created and sized)
	live  map[string]*blockExport // exports by name
	devs  map[string]*blockDev    // opened devices by name, with their traffic
}

// blockDev counts one device's data-plane traffic: all its exports'.
type blockDev struct {
	path string
	size int64
	io   nbd.IOCounters
}

// blockExport is one served (or suspended) export.
type blockExport struct {
	ex nbd.Export
	be *nbd.FileBackend
	// suspended: not served (the server keeps it, and the state of a
	// move of it, until Resume: nbd.Server.SuspendExport).
	suspended bool
	// A part moving (move_block.go): incoming is the token its range is
	// served under until the move's commit serves ex; retired means ex
	// was retired from the server (moved away).
	incoming string
	retired  bool
}

// registered is the name the server knows the export by ("" for none); a
// suspended export is known, not served.
func (x *blockExport) registered() string {
	switch {
	case x.incoming != "":
		return x.incoming
	case x.retired:
		return ""
	}
	return x.ex.Name
}

// NewBlockDriver returns a block driver logging to log.
func NewBlockDriver(log *slog.Logger) *BlockDriver {
	return &BlockDriver{
		srv:    nbd.Server{Logger: log},
		scheme: "nbd",
		paths:  map[string]bool{},
		live:   map[string]*blockExport{},
		devs:   map[string]*blockDev{},
	}
}

// UseTLS implements TLSUser: the NBD server requires TLS
// (NBD_OPT_STARTTLS, the protocol's FORCEDTLS mode) with the node
// certificate, and URIs are nbds://; client verifies the destinations of
// moves that serve nbds://, and track ends a move's connection to one
// whose certificate a later revocation list revokes. Call it before
// Serve.
func (b *BlockDriver) UseTLS(server *tls.Config, client func() *tls.Config, track pki.TrackFunc) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cliTLS, b.track = client, track
	if server == nil {
		return
	}
	b.srv.TLSConfig = server
	b.scheme = "nbds"
}

// usePSK lets the NBD server also take TLS with the pre-shared keys (with
// TLS on, after UseTLS; before Serve).
func (b *BlockDriver) usePSK(keys *tlspsk.Keys) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.srv.PSK = keys
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
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return dev, err
	}
	have := st.Size()
	if !st.Mode().IsRegular() { // a block device: its size is where it ends
		if have, err = f.Seek(0, io.SeekEnd); err != nil {
			return dev, err
		}
	}
	switch {
	case dev.Size == 0:
		dev.Size = have
	case !st.Mode().IsRegular() && have < dev.Size:
		return dev, fmt.Errorf("block device %s has %d bytes, fewer than the %d configured", dev.Name, have, dev.Size)
	case st.Mode().IsRegular() && st.Size() < dev.Size:
		if err := f.Truncate(dev.Size); err != nil {
			return dev, err
		}
	}
	if dev.Size <= 0 {
		return dev, fmt.Errorf("block device %s has no size", dev.Name)
	}
	b.mu.Lock()
	b.paths[dev.Path] = true
	if d := b.devs[dev.Name]; d == nil || d.path != dev.Path {
		b.devs[dev.Name] = &blockDev{path: dev.Path, size: dev.Size}
	}
	b.mu.Unlock()
	return dev, nil
}

// Prepare adds an NBD export of the requested range.
func (b *BlockDriver) Prepare(_ context.Context, e Export) (api.PrepareResponse, error) {
	b.mu.Lock()
	uri := b.scheme + "://" + e.Endpoint + "/" + e.Request.Export
	defer b.mu.Unlock()
	if _, ok := b.live[e.Request.Export]; ok {
		return api.PrepareResponse{URI: uri}, nil
	}
	if !b.paths[e.Device.Path] {
		return api.PrepareResponse{}, fmt.Errorf("%w: %s is not open", ErrNoDevice, e.Device.Name)
	}
	be, err := nbd.OpenFile(e.Device.Path, nbd.FileOptions{Offset: e.Request.Offset, Length: e.Request.Length})
	if err != nil {
		return api.PrepareResponse{}, err
	}
	ex := b.leaseExportLocked(e, be)
	if err := b.srv.AddExport(ex); err != nil {
		be.Close()
		return api.PrepareResponse{}, err
	}
	b.live[e.Request.Export] = &blockExport{ex: ex, be: be}
	return api.PrepareResponse{URI: uri}, nil
}

// leaseExportLocked is the NBD export of e's lease over be: what a
// prepare serves, and a move's commit here (ActivateMove). b.mu is held.
func (b *BlockDriver) leaseExportLocked(e Export, be *nbd.FileBackend) nbd.Export {
	ex := nbd.Export{Name: e.Request.Export, Backend: be, Description: "rialto lease " + e.Request.LeaseID, Deadline: e.deadline}
	if d := b.devs[e.Device.Name]; d != nil && d.path == e.Device.Path {
		ex.Counters = &d.io
	}
	if e.Request.BandwidthCap > 0 || e.Request.IOPSCap > 0 {
		ex.Limit = &nbd.RateLimit{BytesPerSec: float64(e.Request.BandwidthCap), IOPS: float64(e.Request.IOPSCap)}
	}
	return ex
}

// Teardown removes the export, closing its connections; once it returns
// no request of the lease reaches the device.
func (b *BlockDriver) Teardown(_ context.Context, e Export) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, ok := b.live[e.Request.Export]
	if !ok {
		return nil
	}
	delete(b.live, e.Request.Export)
	var err error
	if name := x.registered(); name != "" {
		err = b.srv.RemoveExport(name)
	}
	if cerr := x.be.Close(); err == nil && !errors.Is(cerr, nbd.ErrBackendClosed) {
		err = cerr
	}
	return err
}

// Suspend stops serving the export (closing its connections) and keeps
// its data; Resume serves it again. A move of the export stays as it was
// (nbd.Server.SuspendExport): a sealed move still holds the writes once
// the export is served again, and its commit retires the export, served
// or not.
func (b *BlockDriver) Suspend(_ context.Context, e Export) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, ok := b.live[e.Request.Export]
	if !ok || x.suspended || x.registered() != e.Request.Export {
		return nil
	}
	if err := b.srv.SuspendExport(e.Request.Export); err != nil {
		return fmt.Errorf("agent: suspend the export: %w", err)
	}
	x.suspended = true
	return nil
}

// Resume serves a suspended export again.
func (b *BlockDriver) Resume(_ context.Context, e Export) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, ok := b.live[e.Request.Export]
	if !ok {
		return fmt.Errorf("%w: export not prepared", ErrNoDevice)
	}
	if !x.suspended || x.incoming != "" || x.retired {
		return nil
	}
	if err := b.srv.ResumeExport(x.ex.Name); err != nil {
		return fmt.Errorf("agent: resume the export: %w", err)
	}
	x.suspended = false
	return nil
}

// wipeChunk bounds one zeroing call, so that a long wipe (writing zeroes
// where the device cannot zero cheaply) notices cancellation.
const wipeChunk = 1 << 30

// Wipe makes the export's range read as zeroes and durable: holes punched
// in a file, the device's write-zeroes (or BLKZEROOUT) on a block device,
// zeroes written where neither works, then fdatasync. It does not touch a
// byte outside the range.
func (b *BlockDriver) Wipe(ctx context.Context, e Export) error {
	off, n := e.Request.Offset, e.Request.Length
	if n <= 0 {
		return nil
	}
	aligned := n &^ 511
	if aligned > 0 {
		be, err := nbd.OpenFile(e.Device.Path, nbd.FileOptions{Offset: off, Length: aligned})
		if err != nil {
			return fmt.Errorf("agent: wipe: %w", err)
		}
		for pos := int64(0); pos < aligned; pos += wipeChunk {
			if err := ctx.Err(); err != nil {
				be.Close()
				return fmt.Errorf("agent: wipe interrupted: %w", err)
			}
			if err := be.WriteZeroes(pos, min(wipeChunk, aligned-pos), false); err != nil {
				be.Close()
				return fmt.Errorf("agent: wipe: %w", err)
			}
		}
		err = be.Flush()
		if cerr := be.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("agent: wipe: %w", err)
		}
	}
	if rest := n - aligned; rest > 0 {
		f, err := os.OpenFile(e.Device.Path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("agent: wipe: %w", err)
		}
		_, err = f.WriteAt(make([]byte, rest), off+aligned)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("agent: wipe: %w", err)
		}
	}
	return nil
}

// Serve runs the NBD server.
func (b *BlockDriver) Serve(ctx context.Context, ln net.Listener) error {
	return b.srv.Serve(ctx, ln)
}

// Close stops serving every export and closes their backends.
func (b *BlockDriver) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first error
	for name, x := range b.live {
		if s := x.registered(); s != "" {
			b.srv.RemoveExport(s)
		}
		if err := x.be.Close(); err != nil && first == nil && !errors.Is(err, nbd.ErrBackendClosed) {
			first = err
		}
		delete(b.live, name)
	}
	return first
}

// Usage implements UsageReporter: each opened device's traffic, and what
// its backing file holds (its allocated blocks; a block device's is
// unknown).
func (b *BlockDriver) Usage() []api.DeviceCounters {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]api.DeviceCounters, 0, len(b.devs))
	for name, d := range b.devs {
		c := api.DeviceCounters{Name: name, ReadBytes: d.io.Read.Load(), WrittenBytes: d.io.Written.Load()}
		if st, err := os.Stat(d.path); err == nil && st.Mode().IsRegular() {
			if sys, ok := st.Sys().(*syscall.Stat_t); ok {
				used := min(sys.Blocks*512, d.size)
				c.UsedBytes = &used
			}
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
