package nbd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FileOptions selects the part of a file or block device to serve.
type FileOptions struct {
	// Offset is where the partition starts in the file.
	Offset int64
	// Length is the partition length; 0 means up to the end of the file.
	// The served size is rounded down to a multiple of 512 bytes.
	Length int64
	// ReadOnly opens the file read-only.
	ReadOnly bool
	// CopyReads serves every read by copying its bytes into the reply
	// (pread), never zero-copy with sendfile(2), as if the backing were
	// not known to drop its pages from the page cache when wiped (see
	// [FileBackend.ZeroCopyRange]).
	CopyReads bool
}

// FileBackend serves a file or block device, or a partition of one.
// Flush is fdatasync, which covers every write through any descriptor, so
// the export advertises NBD_FLAG_CAN_MULTI_CONN. FUA writes use
// pwritev2(RWF_DSYNC). On a regular file, Trim punches holes and
// WriteZeroes punches holes or uses FALLOC_FL_ZERO_RANGE. On a block device,
// Trim is BLKDISCARD and WriteZeroes is fallocate (which the kernel turns
// into the device's write-zeroes command), else BLKZEROOUT; either falls
// back to writing zeroes. Every operation stays within the partition: a hole
// punched, a range discarded or zeroed never reaches a byte outside
// [Offset, Offset+Length), so partitions of one file or device can be lent
// to different tenants. Extents (base:allocation) come from an allocation
// bitmap built once with SEEK_DATA/SEEK_HOLE and updated by every write, so
// block-status queries cost no system calls; writes by other processes are
// not seen by it, and a range trimmed through the backend is still
// reported as data until the backend is opened again (the bitmap only ever
// grows, so that data is never reported as a hole). A block device reports
// its whole range as data.
//
// Large reads are sent zero-copy with sendfile(2) only within
// [FileBackend.ZeroCopyRange]: the socket then holds references to the
// page-cache pages until the bytes leave it (on this host: until the
// receiver reads them), so a page sent so must never be rewritten in place
// for another tenant. Other reads are copied into the reply.
//
// Close may run while requests are in flight. Every use of the file
// descriptor holds a reference, so the descriptor is closed only once the
// last use has ended (a large read reply being sent with sendfile holds it
// until sent): a request never reads or writes through a descriptor number
// that was closed and reused for another file. Uses that start after Close
// fail with an error wrapping [ErrBackendClosed].
type FileBackend struct {
	f    *os.File
	fd   int // valid while a use is held (acquire/release)
	base int64
	size int64
	ro   bool

	noFUA    atomic.Bool  // pwritev2 unsupported
	noZero   atomic.Bool  // FALLOC_FL_ZERO_RANGE unsupported
	noPunch  atomic.Bool  // FALLOC_FL_PUNCH_HOLE unsupported
	end      atomic.Int64 // file size last seen (for sendfile)
	inMemory bool         // file on tmpfs or ramfs

	// A block device: trim is BLKDISCARD and zeroing falls back to
	// BLKZEROOUT, both on whole logical blocks of sector bytes.
	blockDev  bool
	sector    int64
	noDiscard atomic.Bool // BLKDISCARD unsupported
	noZeroOut atomic.Bool // BLKZEROOUT unsupported
	mm        *fileMap    // mapping when inMemory (nil if mmap failed), writable unless ro

	// Reads within [zcLo, zcHi) of the partition may be sent zero-copy
	// (sendfile); both are 0 when none may.
	zcLo, zcHi int64

	alloc allocMap

	// uses counts the descriptor's uses in flight; Close sets usesClosed.
	// The descriptor is closed when both hold: closed and no use.
	uses      atomic.Int64
	closeOnce sync.Once
}

// usesClosed marks FileBackend.uses once Close has run.
const usesClosed = int64(1) << 62

// acquire takes a reference on the descriptor, or reports false once the
// backend is closed. Each successful acquire needs one release.
func (b *FileBackend) acquire() bool {
	if b.uses.Add(1)&usesClosed != 0 {
		b.release()
		return false
	}
	return true
}

// release drops a reference taken by acquire; the last one after Close
// closes the file.
func (b *FileBackend) release() {
	if b.uses.Add(-1) == usesClosed {
		b.closeFile()
	}
}

func (b *FileBackend) closeFile() (err error) {
	b.closeOnce.Do(func() { err = b.f.Close() })
	return err
}

func (b *FileBackend) closedErr(op string) error {
	return fmt.Errorf("nbd: %s: %w", op, ErrBackendClosed)
}

// OpenFile opens path (a regular file or a block device) as a backend.
func OpenFile(path string, o FileOptions) (*FileBackend, error) {
	flag := os.O_RDWR
	if o.ReadOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("nbd: open backend: %w", err)
	}
	b, err := NewFileBackend(f, o)
	if err != nil {
		f.Close()
		return nil, err
	}
	return b, nil
}

// NewFileBackend serves an open file; the backend owns f from then on.
func NewFileBackend(f *os.File, o FileOptions) (*FileBackend, error) {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("nbd: backend size: %w", err)
	}
	if o.Offset < 0 || o.Length < 0 || o.Offset > end {
		return nil, fmt.Errorf("%w: partition [%d,+%d) outside a %d-byte file", ErrInvalidExport, o.Offset, o.Length, end)
	}
	length := o.Length
	if length == 0 {
		length = end - o.Offset
	}
	if o.Offset+length > end {
		return nil, fmt.Errorf("%w: partition [%d,+%d) outside a %d-byte file", ErrInvalidExport, o.Offset, o.Length, end)
	}
	length &^= 511
	if length == 0 {
		return nil, fmt.Errorf("%w: backend smaller than 512 bytes", ErrInvalidExport)
	}
	b := &FileBackend{f: f, fd: int(f.Fd()), base: o.Offset, size: length, ro: o.ReadOnly}
	var st unix.Stat_t
	statOK := unix.Fstat(b.fd, &st) == nil
	if statOK && st.Mode&unix.S_IFMT == unix.S_IFBLK {
		b.blockDev, b.sector = true, 512
		if ss, err := unix.IoctlGetInt(b.fd, unix.BLKSSZGET); err == nil && ss >= 512 && ss&(ss-1) == 0 {
			b.sector = int64(ss)
		}
	}
	// Only a regular file's reads are sent with sendfile (sendfileRange:
	// longEnough); a block device's are copied.
	if !o.CopyReads && statOK && st.Mode&unix.S_IFMT == unix.S_IFREG && wipeDropsPages(b.fd, &st) {
		b.zcLo, b.zcHi = wholePages(b.base, length, ZeroCopyAlign())
	}
	var sfs unix.Statfs_t
	if unix.Fstatfs(b.fd, &sfs) == nil && (sfs.Type == unix.TMPFS_MAGIC || sfs.Type == unix.RAMFS_MAGIC) {
		b.inMemory = true
	}
	if b.inMemory {
		// Page-sized chunks, so that reads through the mapping do not
		// fault pages into holes next to data.
		b.alloc.init(length, 12)
	} else {
		b.alloc.init(length, 16)
	}
	if b.inMemory {
		if b.mm = newFileMap(b.fd, b.base, length, !b.ro); b.mm != nil {
			// Reads go through the mapping only where the bitmap says
			// data may be, so build it now (cheap on tmpfs).
			b.alloc.once.Do(func() { b.alloc.scan(b) })
		}
	}
	return b, nil
}

// Size implements Backend.
func (b *FileBackend) Size() int64 { return b.size }

// memorySpeed reports whether the file lives in memory (tmpfs, ramfs):
// its requests never wait for a device, so the server serves them in
// groups (conn.go).
func (b *FileBackend) memorySpeed() bool { return b.inMemory }

// MultiConnSafe implements MultiConnSafer: fdatasync is global.
func (b *FileBackend) MultiConnSafe() bool { return true }

// ZeroCopyRange returns the part [off, off+n) of the partition whose reads
// may be sent zero-copy (sendfile); n is 0 when none may. It is decided at
// open: the partition's whole pages, if it is a regular file on a
// filesystem known to drop a wiped range's pages from the page cache
// rather than rewrite them in place (tmpfs, ext4, XFS, btrfs: their hole
// punching does) and [FileOptions.CopyReads] is not set; elsewhere the
// wipe may fall back to writing zeroes in place. A block device's reads
// are always copied. A page only partly inside the partition (its last,
// where the partition's length is not a multiple of the page size; its
// first, where its offset is not page aligned) is zeroed in place by a
// punched hole and written in place by the next tenant of the range or of
// the bytes beside it, so it is never sent zero-copy; nor is any page of a
// large folio the partition's edge may cut: the range is the partition's
// whole spans of [ZeroCopyAlign] (docs/nbd.md, "Zero-copy reads and the
// wipe").
func (b *FileBackend) ZeroCopyRange() (off, n int64) { return b.zcLo, b.zcHi - b.zcLo }

// ZeroCopyAlign is the granularity of [FileBackend.ZeroCopyRange]: the
// largest folio the page cache may hold a file in (the transparent huge
// page size, /sys/kernel/mm/transparent_hugepage/hpage_pmd_size; 2 MiB
// where that cannot be read), at least the page size. A folio a wipe's
// punched hole covers only in part is zeroed in place and kept, not
// dropped, when it cannot be split — and a folio a socket references
// cannot be — so only whole aligned spans of this size inside a partition
// are sent zero-copy. A partition aligned to it (a lease of whole MiB
// pairs at an offset of whole MiB pairs, as `rialto up` and the
// benchmarks lend them) keeps zero-copy throughout.
func ZeroCopyAlign() int64 { return zeroCopyAlign() }

var zeroCopyAlign = sync.OnceValue(func() int64 {
	n := int64(2 << 20)
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 && v&(v-1) == 0 {
			n = v
		}
	}
	return max(n, int64(unix.Getpagesize()))
})

// wholePages returns, as offsets into a partition of length bytes at base,
// the aligned spans of size pg that lie entirely within it ([0, 0) if
// none).
func wholePages(base, length, pg int64) (lo, hi int64) {
	first := (base + pg - 1) &^ (pg - 1)
	last := (base + length) &^ (pg - 1)
	if last <= first {
		return 0, 0
	}
	return first - base, last - base
}

// fsExtentFL is FS_EXTENT_FL (lsattr's 'e'): an ext4 inode mapped by
// extents.
const fsExtentFL = 0x00080000

// wipeDropsPages reports whether wiping a range of fd (described by st)
// removes the range's whole pages from the page cache, so that bytes still
// referenced by a socket (sendfile) are never rewritten in place: true for
// a block device and for a regular file on a filesystem whose
// FALLOC_FL_PUNCH_HOLE is known to work (tmpfs, XFS, btrfs; on ext4, files
// mapped by extents, which only the ext4 driver serves: the ext2 driver,
// which shares its magic number, has no fallocate). Elsewhere the wipe
// may fall back to writing zeroes over the same pages.
func wipeDropsPages(fd int, st *unix.Stat_t) bool {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		return true
	case unix.S_IFREG:
	default:
		return false
	}
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) != nil {
		return false
	}
	switch uint32(sfs.Type) {
	case unix.TMPFS_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC:
		return true
	case unix.EXT4_SUPER_MAGIC:
		fl, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
		return err == nil && fl&fsExtentFL != 0
	}
	return false
}

// within reports whether [off, off+n) is a non-empty range inside [lo,
// hi), computed without overflow: the ranges handed out for the paths that
// bypass pread and pwrite (sendfile, splice, the mappings) are checked by
// the backend itself, not only by the server's check of the request, so
// that none reaches past the partition into a neighbour's bytes.
func within(off, n, lo, hi int64) bool {
	return n > 0 && off >= lo && off <= hi && n <= hi-off
}

// sendfileRange implements sendfileSource: ok=false outside the zero-copy
// range. After ok=true the descriptor is held until releaseFD.
func (b *FileBackend) sendfileRange(off, n int64) (int, int64, bool) {
	if !within(off, n, b.zcLo, b.zcHi) || !b.acquire() {
		return 0, 0, false
	}
	// The file must be long enough: sendfile cannot read a hole past EOF
	// as zeroes the way pread's caller does.
	if b.end.Load() < b.base+off+n && !b.longEnough(b.base+off+n) {
		b.release()
		return 0, 0, false
	}
	return b.fd, b.base + off, true
}

// longEnough reports whether the file is a regular file of at least end
// bytes. The caller holds a use of the descriptor.
func (b *FileBackend) longEnough(end int64) bool {
	var st unix.Stat_t
	if err := unix.Fstat(b.fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	b.end.Store(st.Size)
	return st.Size >= end
}

// releaseFD implements sendfileSource and spliceTarget.
func (b *FileBackend) releaseFD() { b.release() }

// spliceDest implements spliceTarget. After ok=true the descriptor is held
// until releaseFD.
func (b *FileBackend) spliceDest(off, n int64) (int, int64, bool) {
	if b.ro || !within(off, n, 0, b.size) || !b.acquire() {
		return 0, 0, false
	}
	b.alloc.mark(off, n)
	return b.fd, b.base + off, true
}

// mapRange implements mappedSource for files on tmpfs or ramfs.
func (b *FileBackend) mapRange(off, n int64) ([]byte, bool) {
	if b.mm == nil || !within(off, n, 0, b.size) || !b.alloc.allSet(off, n) {
		return nil, false
	}
	return b.mm.get(off, n)
}

func (b *FileBackend) unmapRange() { b.mm.put() }

// mapWrite implements mappedTarget for files on tmpfs or ramfs: the
// writable mapping of [off, off+n), marked as data, if the file is that
// long (a store past its end would fault). After ok=true the caller calls
// unmapRange once it has written.
func (b *FileBackend) mapWrite(off, n int64) ([]byte, bool) {
	if b.mm == nil || !b.mm.writable || b.ro || !within(off, n, 0, b.size) || !b.acquire() {
		return nil, false
	}
	defer b.release()
	if b.end.Load() < b.base+off+n && !b.longEnough(b.base+off+n) {
		return nil, false
	}
	p, ok := b.mm.get(off, n)
	if ok {
		b.alloc.mark(off, n)
	}
	return p, ok
}

// Close closes the backend: requests that start afterwards fail with
// [ErrBackendClosed]. If no request is using the file it is closed at once
// and Close returns the result; otherwise Close returns nil and the file is
// closed when the last use ends (a reply being sent with sendfile, or a
// spliced write payload still arriving, ends when the client reads it or
// its connection is closed, e.g. by [Server.RemoveExport]). Likewise a
// mapping still referenced by a reply being sent, or by a write whose
// payload is being read into it (a file on tmpfs or ramfs), is unmapped
// when that send or write completes: such a write's bytes may still land
// after Close, until its connection is closed. So a range is wiped for its
// next tenant only after [Server.RemoveExport] (or [Server.Retire]) of
// every export serving it has returned, as the agent's teardown does.
// Closing twice returns ErrBackendClosed.
func (b *FileBackend) Close() error {
	old := b.uses.Or(usesClosed)
	if old&usesClosed != 0 {
		return b.closedErr("close")
	}
	if b.mm != nil {
		b.mm.close()
	}
	if old == 0 {
		return b.closeFile()
	}
	return nil
}

func (b *FileBackend) check(off, n int64) error {
	if off < 0 || n < 0 || off > b.size || n > b.size-off {
		return fmt.Errorf("nbd: range [%d,+%d) outside the %d-byte backend", off, n, b.size)
	}
	return nil
}

// ReadAt implements io.ReaderAt.
func (b *FileBackend) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= b.size {
		return 0, io.EOF
	}
	var eof error
	if rem := b.size - off; int64(len(p)) > rem {
		p, eof = p[:rem], io.EOF
	}
	if !b.acquire() {
		return 0, b.closedErr("read")
	}
	defer b.release()
	done := 0
	for done < len(p) {
		n, err := unix.Pread(b.fd, p[done:], b.base+off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, fmt.Errorf("nbd: pread: %w", err)
		}
		if n == 0 {
			// The file shrank under us: read zeroes like a hole.
			clear(p[done:])
			break
		}
		done += n
	}
	return len(p), eof
}

// WriteAt implements io.WriterAt.
func (b *FileBackend) WriteAt(p []byte, off int64) (int, error) {
	return b.write(p, off, false)
}

// WriteAtFUA implements FUAWriter: the data is durable when it returns.
func (b *FileBackend) WriteAtFUA(p []byte, off int64) (int, error) {
	return b.write(p, off, true)
}

func (b *FileBackend) write(p []byte, off int64, fua bool) (int, error) {
	if b.ro {
		return 0, fmt.Errorf("nbd: write: %w", unix.EROFS)
	}
	if err := b.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	if !b.acquire() {
		return 0, b.closedErr("write")
	}
	defer b.release()
	b.alloc.mark(off, int64(len(p)))
	done := 0
	if fua && !b.noFUA.Load() {
		iov := [][]byte{p}
		for done < len(p) {
			iov[0] = p[done:]
			n, err := unix.Pwritev2(b.fd, iov, b.base+off+int64(done), unix.RWF_DSYNC)
			if err == unix.EINTR {
				continue
			}
			if err == unix.ENOSYS || err == unix.EOPNOTSUPP || (err == unix.EINVAL && done == 0) {
				b.noFUA.Store(true)
				break
			}
			if err != nil {
				return done, fmt.Errorf("nbd: pwritev2: %w", err)
			}
			done += n
		}
		if done == len(p) {
			return done, nil
		}
	}
	for done < len(p) {
		var (
			n   int
			err error
		)
		if b.inMemory {
			// A memory copy into the page cache (rawcall.go).
			n, err = rawPwrite(b.fd, p[done:], b.base+off+int64(done))
		} else {
			n, err = unix.Pwrite(b.fd, p[done:], b.base+off+int64(done))
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, fmt.Errorf("nbd: pwrite: %w", err)
		}
		done += n
	}
	if fua {
		if err := b.Flush(); err != nil {
			return done, err
		}
	}
	return done, nil
}

// Flush implements Backend with fdatasync. On tmpfs and ramfs, whose
// fsync does nothing (the kernel's noop_fsync: the page cache is all the
// storage there is), Flush makes no system call at all.
func (b *FileBackend) Flush() error {
	if b.ro {
		return nil
	}
	if !b.acquire() {
		return b.closedErr("flush")
	}
	defer b.release()
	if b.inMemory {
		return nil
	}
	for {
		err := unix.Fdatasync(b.fd)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("nbd: fdatasync: %w", err)
		}
		return nil
	}
}

func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.ENODEV)
}

func (b *FileBackend) fallocate(mode uint32, off, n int64) error {
	if !b.acquire() {
		return ErrBackendClosed
	}
	defer b.release()
	for {
		err := unix.Fallocate(b.fd, mode, b.base+off, n)
		if err != unix.EINTR {
			return err
		}
	}
}

// Trim implements Trimmer by punching a hole in a file or discarding the
// whole logical blocks of the range on a block device (a no-op where
// unsupported: trim is advisory).
func (b *FileBackend) Trim(off, n int64) error {
	if b.ro {
		return fmt.Errorf("nbd: trim: %w", unix.EROFS)
	}
	if err := b.check(off, n); err != nil || n == 0 {
		return err
	}
	if b.blockDev {
		s, e := b.sectors(off, n)
		if e <= s || b.noDiscard.Load() {
			return nil
		}
		err := b.blkRange(unix.BLKDISCARD, s, e-s)
		if unsupportedIoctl(err) {
			b.noDiscard.Store(true)
			return nil
		}
		if err != nil {
			return fmt.Errorf("nbd: discard: %w", err)
		}
		return nil
	}
	if b.noPunch.Load() {
		return nil
	}
	err := b.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if unsupported(err) {
		b.noPunch.Store(true)
		return nil
	}
	if err != nil {
		return fmt.Errorf("nbd: punch hole: %w", err)
	}
	return nil
}

// WriteZeroes implements Zeroer. Without noHole it punches a hole; with it,
// or where punching is unsupported, it uses FALLOC_FL_ZERO_RANGE, then (on
// a block device) BLKZEROOUT, and falls back to writing zeroes. On a block
// device the parts of the range that do not fill a logical block are
// written as zeroes.
func (b *FileBackend) WriteZeroes(off, n int64, noHole bool) error {
	if b.ro {
		return fmt.Errorf("nbd: write zeroes: %w", unix.EROFS)
	}
	if err := b.check(off, n); err != nil || n == 0 {
		return err
	}
	if b.blockDev {
		s, e := b.sectors(off, n)
		if e <= s {
			return b.writeZeroBufs(off, n)
		}
		if err := b.writeZeroBufs(off, s-off); err != nil {
			return err
		}
		if err := b.writeZeroBufs(e, off+n-e); err != nil {
			return err
		}
		off, n = s, e-s
	}
	if !noHole && !b.noPunch.Load() {
		err := b.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		if err == nil {
			return nil
		}
		if !unsupported(err) {
			return fmt.Errorf("nbd: punch hole: %w", err)
		}
		b.noPunch.Store(true)
	}
	b.alloc.mark(off, n)
	if !b.noZero.Load() {
		err := b.fallocate(unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		if err == nil {
			return nil
		}
		if !unsupported(err) {
			return fmt.Errorf("nbd: zero range: %w", err)
		}
		b.noZero.Store(true)
	}
	if b.blockDev && !b.noZeroOut.Load() {
		err := b.blkRange(unix.BLKZEROOUT, off, n)
		if err == nil {
			return nil
		}
		if !unsupportedIoctl(err) {
			return fmt.Errorf("nbd: zero out: %w", err)
		}
		b.noZeroOut.Store(true)
	}
	return b.writeZeroBufs(off, n)
}

// writeZeroBufs writes zeroes over [off, off+n).
func (b *FileBackend) writeZeroBufs(off, n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeroes)))
		if _, err := b.write(zeroes[:k], off, false); err != nil {
			return err
		}
		off += k
		n -= k
	}
	return nil
}

// sectors returns the whole logical blocks of the device within [off,
// off+n) of the partition, as partition offsets [s, e) (e <= s if none).
func (b *FileBackend) sectors(off, n int64) (s, e int64) {
	abs, end := b.base+off, b.base+off+n
	as := (abs + b.sector - 1) &^ (b.sector - 1)
	ae := end &^ (b.sector - 1)
	return as - b.base, ae - b.base
}

// blkRange runs a block-device range ioctl (BLKDISCARD, BLKZEROOUT) on
// [off, off+n) of the partition.
func (b *FileBackend) blkRange(req uint, off, n int64) error {
	if !b.acquire() {
		return ErrBackendClosed
	}
	defer b.release()
	r := [2]uint64{uint64(b.base + off), uint64(n)}
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(b.fd), uintptr(req), uintptr(unsafe.Pointer(&r[0])))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

func unsupportedIoctl(err error) bool {
	return unsupported(err) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL)
}

// Extents implements Extenter from the allocation bitmap.
func (b *FileBackend) Extents(off, n int64) ([]Extent, error) {
	if err := b.check(off, n); err != nil {
		return nil, err
	}
	if !b.acquire() {
		return nil, b.closedErr("extents")
	}
	b.alloc.once.Do(func() { b.alloc.scan(b) })
	b.release()
	return b.alloc.extents(off, n), nil
}

// allocMap records, per chunk, whether the chunk may hold data. Bits are
// only ever set (by the initial scan and by writes), so a chunk reported as
// a hole never holds data written through this backend.
type allocMap struct {
	once    sync.Once
	shift   uint
	size    int64
	words   []atomic.Uint64
	allData atomic.Bool // SEEK_DATA unsupported or failed
}

const maxAllocBits = 8 << 20 // 1 MiB of bitmap at most

// init sizes the map for size bytes in chunks of 1<<shift bytes, or larger
// chunks if the bitmap would exceed maxAllocBits.
func (a *allocMap) init(size int64, shift uint) {
	a.size = size
	a.shift = shift
	for (size>>a.shift)+1 > maxAllocBits {
		a.shift++
	}
	nbits := (size + 1<<a.shift - 1) >> a.shift
	a.words = make([]atomic.Uint64, (nbits+63)/64)
}

// mark records that [off, off+n) may hold data.
func (a *allocMap) mark(off, n int64) {
	if n <= 0 {
		return
	}
	first, last := off>>a.shift, (off+n-1)>>a.shift
	for i := first; i <= last; i++ {
		w := &a.words[i/64]
		m := uint64(1) << (i % 64)
		if w.Load()&m == 0 {
			w.Or(m)
		}
	}
}

// scan builds the map with SEEK_DATA/SEEK_HOLE; the caller holds a use of
// b's descriptor (or b is not yet shared).
func (a *allocMap) scan(b *FileBackend) {
	pos, end := b.base, b.base+b.size
	for pos < end {
		d, err := unix.Seek(b.fd, pos, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break
		}
		if err != nil {
			a.allData.Store(true)
			break
		}
		if d >= end {
			break
		}
		h, err := unix.Seek(b.fd, d, unix.SEEK_HOLE)
		if err != nil {
			a.allData.Store(true)
			break
		}
		h = min(h, end)
		if h <= d {
			a.allData.Store(true)
			break
		}
		a.mark(d-b.base, h-d)
		pos = h
	}
}

// allSet reports whether every chunk of [off, off+n) may hold data.
func (a *allocMap) allSet(off, n int64) bool {
	if a.allData.Load() {
		return true
	}
	for i, last := off>>a.shift, (off+n-1)>>a.shift; i <= last; i++ {
		if !a.bit(i) {
			return false
		}
	}
	return true
}

func (a *allocMap) bit(i int64) bool {
	return a.words[i/64].Load()&(1<<(i%64)) != 0
}

// extents answers a block-status query from the bitmap in one pass.
func (a *allocMap) extents(off, n int64) []Extent {
	if a.allData.Load() {
		return []Extent{{Length: n}}
	}
	end := off + n
	var out []Extent
	pos := off
	for pos < end && len(out) < maxExtentsList {
		i := pos >> a.shift
		data := a.bit(i)
		j := i + 1
		// Skip whole words of equal state quickly.
		for j<<a.shift < end {
			if j%64 == 0 {
				w := a.words[j/64].Load()
				if (data && w == ^uint64(0)) || (!data && w == 0) {
					j += 64
					continue
				}
			}
			if a.bit(j) != data {
				break
			}
			j++
		}
		stop := min(j<<a.shift, end)
		var fl uint32
		if !data {
			fl = StateHole | StateZero
		}
		out = append(out, Extent{Length: stop - pos, Flags: fl})
		pos = stop
	}
	return out
}
