// Package dirty is the bitmap a lender keeps of the parts of a range that
// changed while it copies the range to another lender (a lease moved while
// it is used): the NBD server marks the writes to a block export in it,
// the memory donor the writes to a region, and the copier takes the marked
// ranges and copies them again, pass after pass. It also holds the write
// gate both lenders put in front of a range while it moves (Writes, Gate):
// writes are counted, marked, held for the copier's last pass and refused
// once the range is served elsewhere. A move's wait for the writes under
// way stops the writers (connections) whose write stalls, and only them
// (Stall): a payload withheld, or one still trickling in at a limit.
//
// The zero Map is not usable; use New. A Map's methods are safe for
// concurrent use: Take clears each word of the bitmap atomically as it
// reads it, so a chunk marked while it runs is either in its answer or
// still marked after it. The zero Writes is ready to use (no move); a Gate
// comes from Writes.Install. Both are safe for concurrent use.
package dirty
