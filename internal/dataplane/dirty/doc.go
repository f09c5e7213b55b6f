// Package dirty is the bitmap a lender keeps of the parts of a range that
// changed while it copies the range to another lender (a lease moved while
// it is used): the NBD server marks the writes to a block export in it,
// the memory donor the writes to a region, and the copier takes the marked
// ranges and copies them again, pass after pass.
//
// The zero Map is not usable; use New. A Map's methods are safe for
// concurrent use: Take clears each word of the bitmap atomically as it
// reads it, so a chunk marked while it runs is either in its answer or
// still marked after it.
package dirty
