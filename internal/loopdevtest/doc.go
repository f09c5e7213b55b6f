// Package loopdevtest attaches files to loop devices for tests that need a
// real block device (BLKDISCARD, BLKZEROOUT, O_EXCL claims).
//
// It is test code: the rialto binary never imports it (internal/deptest).
// Attach has no state; it is safe to call from parallel tests, each device
// being detached by its own test's cleanup.
package loopdevtest
