// Package vmtest builds a tiny test guest for VM tests: the host's Debian
// kernel (from /boot, uncompressed for a fast PVH boot when it can be) and
// an initramfs of busybox (busybox-static) with the virtio modules the
// kernel needs for a virtio disk. The guest's /init looks for a marker on
// its disk (/dev/vda at MarkerOffset): if it finds one it prints "FOUND
// VALUE" on the console, else it writes "rialto.marker=VALUE" of the kernel
// command line there (synced) and prints "WROTE VALUE"; then it prints
// "IDLE" and waits to be stopped, or, booted with AppendReads or
// AppendWrites, keeps reading its disk (Read), or writing it and reading
// back (RW), every second. It is imported only by tests.
//
// Find skips the test, with the reason, when the kernel, its modules or a
// static busybox are missing. Functions are safe for concurrent use; the
// uncompressed kernel and the initramfs are kept in the system's temp dir
// (one file each per kernel and user), the kernel reused across runs.
package vmtest
