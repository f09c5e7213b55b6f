// Package fusefile serves a block device as one regular file in a FUSE
// mount, so that a kernel file system can be put on it with a loop device
// (`mount -o loop DIR/disk MNT`) on a machine whose kernel has no NBD
// client. `rialto attach --fuse DIR` uses it: the attach process is then
// both the FUSE server and the lease's NBD client, one process between the
// kernel and the lenders where nbdfuse in front of `rialto attach` would be
// two.
//
// Each FUSE request is one call on the [Device]: reads and writes bypass
// the page cache of the FUSE file (direct I/O, parallel writes), fsync is
// the device's Flush, and fallocate's PUNCH_HOLE and ZERO_RANGE are its
// WriteZeroes (a loop device's discard and write-zeroes arrive that way).
// The file cannot be resized. Its access, modification and change times,
// and the mount point's, are the time Serve mounted it, by Config.Clock
// (`rialto attach`: the attach's start), not the epoch. The mount is
// private to the user who made it (no allow_other): other local users,
// root included, cannot open the file. The mount point must be an empty
// directory that is not a mount point.
//
// Zero values: a zero Mount is not usable; use [Serve]. A Mount is safe for
// concurrent use; the FUSE server's goroutines call the Device concurrently,
// so the Device must be safe for concurrent use. Unmount unmounts unless the
// file is in use; Close unmounts in any case (lazily when in use) and waits
// for the server's goroutines where the kernel lets it (see Close); neither
// closes the Device. Done tells when the server stopped, for whatever
// reason.
package fusefile
