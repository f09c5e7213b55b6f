package fusefile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/rialto-project/rialto/internal/backoff"
	"github.com/rialto-project/rialto/internal/clock"
)

// Device is what a Mount serves: a block device of a fixed size.
type Device interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Flush makes every write acknowledged before it durable.
	Flush() error
	Size() int64
}

// Zeroer is implemented by devices that can zero a range without being
// sent zeroes; noHole false lets them deallocate it (punch a hole). The
// range reads as zeroes afterwards either way.
type Zeroer interface {
	WriteZeroes(off, n int64, noHole bool) error
}

// canZeroer lets a Device that implements Zeroer say that it cannot zero
// after all (a composed volume whose parts cannot).
type canZeroer interface {
	CanWriteZeroes() bool
}

// FileName is the name of the file in the mount.
const FileName = "disk"

// maxIO is the largest read or write request the kernel sends (1 MiB, the
// most FUSE allows).
const maxIO = 1 << 20

// Config says how Serve mounts a device.
type Config struct {
	// Dir is the mount point: an existing empty directory.
	Dir string
	// FsName is shown as the mount's source in /proc/mounts ("rialto" if
	// empty). It must not hold a secret: every local user can read it.
	FsName string
	// Logger receives I/O errors (the kernel sees only EIO); nil discards.
	Logger *slog.Logger
	// Clock tells the time of Serve, which is the file's (and the mount
	// point's) access, modification and change time; nil is the real
	// clock.
	Clock clock.Clock
}

// Mount is a device served as Dir/disk.
type Mount struct {
	srv  *fuse.Server
	file *file
	dir  string
	dev  uint64 // the mount's device number
	conn uint64 // the FUSE connection's number (the mount's minor device)
	once sync.Once
	err  error
	done chan struct{} // closed when the server has stopped
	// started is the time of Serve: the file's times.
	started time.Time

	afterBusy func()        // tests: called after each unmount refused as busy
	busyGrace time.Duration // tests: 0 is the package's busyGrace
	busyWait  time.Duration // tests: the wait between tries; 0: a backoff
}

// Serve mounts dev at cfg.Dir and serves it until Close. The caller must
// be allowed to mount FUSE file systems (root, or fusermount3 installed).
func Serve(dev Device, cfg Config) (*Mount, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("fusefile: mount point: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("fusefile: mount point %s is not a directory", dir)
	}
	// An empty directory that is not a mount point already: a mount over
	// files would hide them, and one over another mount (another lease's)
	// would be unmounted in its place.
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return nil, fmt.Errorf("fusefile: mount point %s is not an empty directory (%d entries, %v)", dir, len(ents), err)
	}
	if parent, err := os.Stat(filepath.Dir(dir)); err == nil && dir != "/" && devOf(parent) != devOf(st) {
		return nil, fmt.Errorf("fusefile: %s is a mount point already", dir)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, fmt.Errorf("fusefile: no FUSE on this machine: %w", err)
	}
	name := cfg.FsName
	if name == "" {
		name = "rialto"
	}
	at := clock.Or(cfg.Clock).Now()
	f := &file{dev: dev, log: log, at: at}
	if z, ok := dev.(Zeroer); ok {
		if c, ok := dev.(canZeroer); !ok || c.CanWriteZeroes() {
			f.zero = z
		}
	}
	root := &rootDir{at: at}
	// The size never changes: let the kernel keep attributes and the entry.
	forever := time.Duration(1<<62 - 1)
	srv, err := fs.Mount(dir, root, &fs.Options{
		EntryTimeout: &forever,
		AttrTimeout:  &forever,
		UID:          uint32(os.Getuid()),
		GID:          uint32(os.Getgid()),
		MountOptions: fuse.MountOptions{
			FsName:        name,
			Name:          "rialto",
			MaxWrite:      maxIO,
			DisableXAttrs: true,
			// Replies are written from the read buffer with one writev;
			// splicing would copy them into a pipe first.
			DisableSplice: true,
			Logger:        slog.NewLogLogger(log.Handler(), slog.LevelDebug),
			DirectMount:   os.Geteuid() == 0,
		},
		OnAdd: func(ctx context.Context) {
			root.AddChild(FileName, root.NewPersistentInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 2}), true)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("fusefile: mount %s: %w", dir, err)
	}
	var sst syscall.Stat_t
	if err := syscall.Stat(dir, &sst); err != nil {
		srv.Unmount()
		return nil, fmt.Errorf("fusefile: mount %s: %w", dir, err)
	}
	m := &Mount{srv: srv, file: f, dir: dir, dev: sst.Dev, conn: uint64(unix.Minor(sst.Dev)), done: make(chan struct{}), started: at}
	go func() { srv.Wait(); close(m.done) }()
	return m, nil
}

// Path is the file's path: Dir/disk.
func (m *Mount) Path() string { return filepath.Join(m.dir, FileName) }

// Started is the time Serve mounted the file, by Config.Clock: the file's
// access, modification and change time, and the mount point's.
func (m *Mount) Started() time.Time { return m.started }

// Done is closed once the server has stopped: after Close, or when the
// mount went away otherwise (`fusermount3 -u DIR`, `umount DIR`).
func (m *Mount) Done() <-chan struct{} { return m.done }

// ErrBusy is Unmount's error while the file is in use.
var ErrBusy = errors.New("in use (a loop device or an open file)")

// busyGrace is how long Unmount tries again an unmount refused as busy: a
// loop device lets go of its file asynchronously, a moment after its
// `umount` (or `losetup -d`) returned, so `umount MNT; rialto detach` would
// otherwise find the file still in use.
const busyGrace = 2 * time.Second

// loopGrace is how long, at most, Unmount waits for a loop device that is
// going away: one on the file, set to clear itself on its last close (as
// `mount -o loop` sets it), that no file system mounts any more. Another
// opener of the device (udev's probe after the `umount`, say) holds its
// release back, by more than busyGrace on a loaded machine.
const loopGrace = 20 * time.Second

// Unmount unmounts if the file is not in use; otherwise, once it has been in
// use for busyGrace (loopGrace while the only user is a loop device going
// away), it returns an error wrapping ErrBusy and the mount stays, serving.
// A mount already gone (the user unmounted it) is no error, unless it was
// detached lazily (`umount -l DIR`) while the file is still in use: the
// server then serves on until the last user lets go, and Unmount waits for
// that as for a busy mount.
func (m *Mount) Unmount() error {
	grace := m.busyGrace
	if grace == 0 {
		grace = busyGrace
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	loopCtx, loopCancel := context.WithTimeout(context.Background(), max(loopGrace, grace))
	defer loopCancel()
	retry := backoff.Backoff{Min: 10 * time.Millisecond, Max: 200 * time.Millisecond}
	if m.busyWait > 0 {
		retry.Min, retry.Max = m.busyWait, m.busyWait
	}
	wait := ctx
	for {
		if !m.mounted() {
			// Detached lazily: waited for as long as the mount was
			// (the grace, or a loop device's going away past it).
			select {
			case <-m.done:
				return nil
			case <-wait.Done():
				return fmt.Errorf("fusefile: %s was detached, but its file is still %w: unmount what uses it first", m.dir, ErrBusy)
			}
		}
		err := m.srv.Unmount()
		if err == nil {
			<-m.done
			return nil
		}
		if !m.mounted() {
			continue
		}
		if m.afterBusy != nil {
			m.afterBusy()
		}
		if retry.Wait(wait) != nil {
			// The grace is over (during a try, or, more often, during
			// the wait after one): a loop device seen going away is
			// waited for until it has let go of the file, which is a
			// moment after it has gone from /sys/block.
			if wait == ctx && loopGoingAway(m.Path()) {
				wait = loopCtx
				continue
			}
			return fmt.Errorf("fusefile: %s is %w: unmount what uses it first: %v", m.dir, ErrBusy, err)
		}
	}
}

// loopGoingAway reports whether a loop device on the file at path will
// let go of it by itself: it clears itself on its last close, and no file
// system of this mount namespace is on it. A loop device that does not
// clear itself (`losetup`), or that is mounted, stays until its user acts.
func loopGoingAway(path string) bool {
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if len(devs) == 0 {
		return false
	}
	mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
	going := false
	for _, bf := range devs {
		b, err := os.ReadFile(bf)
		if err != nil || strings.TrimSuffix(string(b), "\n") != path {
			continue
		}
		dir := filepath.Dir(filepath.Dir(bf)) // /sys/block/loopN
		auto, err := os.ReadFile(filepath.Join(dir, "loop", "autoclear"))
		if err != nil || strings.TrimSpace(string(auto)) != "1" {
			return false
		}
		num, err := os.ReadFile(filepath.Join(dir, "dev")) // "7:N"
		if err != nil || mountedFrom(string(mountinfo), strings.TrimSpace(string(num))) {
			return false
		}
		going = true
	}
	return going
}

// mountedFrom reports whether a line of mountinfo has the device majmin
// ("7:0") as its file system's device.
func mountedFrom(mountinfo, majmin string) bool {
	for line := range strings.Lines(mountinfo) {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT ...
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == majmin {
			return true
		}
	}
	return false
}

// mounted reports whether this mount is still at its directory.
func (m *Mount) mounted() bool {
	var st syscall.Stat_t
	return syscall.Stat(m.dir, &st) == nil && st.Dev == m.dev
}

// Close unmounts. If the file is still in use (a loop device on it, an
// open file), the mount is detached lazily: it disappears from the file
// system at once and every later request on it fails (a file system on
// the loop device loses what it had not written back); Close reports that
// it was busy.
func (m *Mount) Close() error {
	m.once.Do(func() {
		err := m.Unmount()
		if err == nil {
			return
		}
		m.file.closed.Store(true)
		m.err = fmt.Errorf("%w; detached it lazily, and requests on it fail from now on", err)
		if m.mounted() {
			if uerr := lazyUnmount(m.dir); uerr != nil {
				m.err = errors.Join(m.err, uerr)
			}
		}
		// The server runs until the last user of the file lets go (every
		// request failing meanwhile): abort the connection so that it
		// ends now. Without the FUSE control file system
		// (/sys/fs/fuse/connections) its goroutines end with that last
		// user, or this process.
		if aerr := os.WriteFile(fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", m.conn), []byte("1"), 0); aerr == nil {
			<-m.done
		}
	})
	return m.err
}

// file is the one file of the mount.
type file struct {
	fs.Inode
	dev  Device
	zero Zeroer // nil: fallocate's zeroing modes are refused
	log  *slog.Logger
	at   time.Time // its atime, mtime and ctime: the time of Serve
	// closed: Close detached the mount while in use; every request fails.
	closed atomic.Bool
}

var (
	_ fs.NodeOpener    = (*file)(nil)
	_ fs.NodeGetattrer = (*file)(nil)
	_ fs.NodeSetattrer = (*file)(nil)
	_ fs.NodeReader    = (*file)(nil)
	_ fs.NodeWriter    = (*file)(nil)
	_ fs.NodeFsyncer   = (*file)(nil)
	_ fs.NodeFlusher   = (*file)(nil)
	_ fs.NodeAllocater = (*file)(nil)
	_ fs.NodeStatfser  = (*file)(nil)
)

// Statfs describes the device: 4 KiB blocks, all of them used (the loop
// driver takes its block size from here).
func (f *file) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	out.Bsize, out.Frsize = 4096, 4096
	out.Blocks = uint64(f.dev.Size()) / 4096
	out.NameLen = 255
	return 0
}

// Open answers with direct I/O: every read and write reaches the device
// (no second page cache under the loop device's), writes to the file run
// in parallel, and close sends no FLUSH (durability is fsync's).
func (f *file) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		return nil, 0, syscall.EPERM
	}
	return nil, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_PARALLEL_DIRECT_WRITES | fuse.FOPEN_NOFLUSH, 0
}

func (f *file) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.attr(out)
	return 0
}

func (f *file) attr(out *fuse.AttrOut) {
	size := uint64(f.dev.Size())
	out.Mode = syscall.S_IFREG | 0o600
	out.Nlink = 1
	out.Size = size
	out.Blksize = 4096
	out.Blocks = (size + 511) / 512
	out.Uid, out.Gid = uint32(os.Getuid()), uint32(os.Getgid())
	out.SetTimes(&f.at, &f.at, &f.at)
}

// rootDir is the mount point's directory, whose times are the file's (a
// plain Inode's are the epoch).
type rootDir struct {
	fs.Inode
	at time.Time
}

var _ fs.NodeGetattrer = (*rootDir)(nil)

func (d *rootDir) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.SetTimes(&d.at, &d.at, &d.at) // the rest as before: go-fuse's defaults
	return 0
}

// Setattr refuses to resize the file; other changes (times, mode) are
// accepted and forgotten, as on a block device node.
func (f *file) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok && int64(sz) != f.dev.Size() {
		return syscall.EPERM
	}
	f.attr(out)
	return 0
}

func (f *file) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f.closed.Load() {
		return nil, syscall.EIO
	}
	size := f.dev.Size()
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if off >= size {
		return fuse.ReadResultData(nil), 0
	}
	if int64(len(dest)) > size-off {
		dest = dest[:size-off]
	}
	n, err := f.dev.ReadAt(dest, off)
	if err != nil {
		f.log.Warn("fusefile: read failed", "off", off, "len", len(dest), "err", err)
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Write writes what fits before the end of the device: a write that
// starts at or past it fails with ENOSPC, as on a block device.
func (f *file) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if f.closed.Load() {
		return 0, syscall.EIO
	}
	size := f.dev.Size()
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if off >= size {
		if len(data) == 0 {
			return 0, 0
		}
		return 0, syscall.ENOSPC
	}
	if int64(len(data)) > size-off {
		data = data[:size-off]
	}
	n, err := f.dev.WriteAt(data, off)
	if err != nil {
		f.log.Warn("fusefile: write failed", "off", off, "len", len(data), "err", err)
		return uint32(n), syscall.EIO
	}
	return uint32(n), 0
}

func (f *file) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if f.closed.Load() {
		return syscall.EIO
	}
	if err := f.dev.Flush(); err != nil {
		f.log.Warn("fusefile: flush failed", "err", err)
		return syscall.EIO
	}
	return 0
}

// Flush (on every close of a descriptor) does nothing: durability is
// fsync's, as for a block device.
func (f *file) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno { return 0 }

// fallocate modes (linux/falloc.h).
const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
	fallocZeroRange = 0x10
)

// Allocate serves fallocate: PUNCH_HOLE (what a loop device sends for a
// discard) may deallocate, ZERO_RANGE may not; both leave the range
// reading as zeroes. Plain allocation within the device is a no-op (every
// byte is always there); other modes, and growing the file, are refused.
func (f *file) Allocate(ctx context.Context, fh fs.FileHandle, off, n uint64, mode uint32) syscall.Errno {
	if f.closed.Load() {
		return syscall.EIO
	}
	size := uint64(f.dev.Size())
	if off > size || n > size-off {
		if mode&fallocKeepSize == 0 {
			return syscall.EFBIG
		}
		if off >= size {
			return 0
		}
		n = size - off
	}
	switch mode &^ fallocKeepSize {
	case 0:
		return 0
	case fallocPunchHole, fallocZeroRange:
		if f.zero == nil {
			return syscall.EOPNOTSUPP
		}
		if n == 0 {
			return 0
		}
		if err := f.zero.WriteZeroes(int64(off), int64(n), mode&fallocPunchHole == 0); err != nil {
			f.log.Warn("fusefile: zeroing failed", "off", off, "len", n, "err", err)
			return syscall.EIO
		}
		return 0
	default:
		return syscall.EOPNOTSUPP
	}
}

// lazyUnmount detaches the mount at dir even though it is in use.
func lazyUnmount(dir string) error {
	if os.Geteuid() == 0 {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err == nil {
			return nil
		}
	}
	if out, err := exec.Command("fusermount3", "-u", "-z", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("fusermount3 -u -z %s: %w: %s", dir, err, out)
	}
	return nil
}

// devOf is a file's device number.
func devOf(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Dev
	}
	return 0
}
