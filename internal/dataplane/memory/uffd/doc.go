// Package uffd is a thin wrapper over Linux userfaultfd(2): open, register a
// range in missing and write-protect modes, read fault messages, and resolve
// faults with UFFDIO_COPY, UFFDIO_WRITEPROTECT and UFFDIO_WAKE.
//
// It holds no policy: the page cache, eviction and the network live in the
// memory package. The zero FD is not usable; build one with Open. An FD's
// methods are safe for concurrent use (they are single ioctls), but fault
// messages should be read by one goroutine.
package uffd
