// Package stripe composes several block devices into one RAID0 volume and
// serves it as a local NBD export, so that a borrower uses N remote lenders as
// one device whose bandwidth is (ideally) the sum of theirs.
//
// A [Volume] is built with [New] over N [Device]s (an *nbd.Client is one) and
// a stripe unit U (a power of two): volume byte x lives on device
// (x/U) mod N at offset ((x/U) div N)·U + x mod U. The volume's size is
// N × min(device size), rounded down to a multiple of U per device. Each
// request is split into per-unit sub-requests that are issued in parallel;
// Flush flushes every device; Trim and WriteZeroes are passed down when every
// device supports them. [Pool] spreads one part over several connections.
//
// Failure: every sub-request runs under a deadline (Config.RequestTimeout). A
// device that misses it is marked failed and closed (if it is an io.Closer),
// which must make its outstanding calls return; the request then fails with
// an error wrapping both [ErrDeviceFailed] and [ErrTimeout], and later
// requests that touch that device fail at once with the same error. Other
// device errors are returned (wrapped, with the device index) without marking
// the device failed. A RAID0 volume has no redundancy: the
// data on a lost part is gone, and the volume reports the loss rather than
// returning wrong data.
//
// [Attach] redials a part whose connection broke (a lender that restarted)
// for up to AttachConfig.RedialTimeout and retries the request once; the next
// Flush then reports writes that no flush had covered with [ErrLostWrites].
// A part whose redial gives up for want of an answer (its lender, or
// AttachConfig.Resolve, unreachable: an outage) fails its requests at once
// and is tried again in the background, with backoff, until it is reached
// (it serves again), Resolve says its lease ended, or its lender's
// certificate is revoked.
//
// With AttachConfig.WriteBack (off by default) the export acknowledges plain
// writes once sent to the lenders, a volatile write cache: a Flush waits for
// them and reports a lender's later failure of one with [ErrWriteBack]
// (writeback.go has the rules: ordering of overlapping requests, bounds).
// [Attachment.Close] waits for them and for the writes under way (within
// the request timeout; [Attachment.CloseContext] stops waiting for the
// writes not yet acknowledged when its ctx ends), flushes what no flush
// covered, then closes the parts, and reports, each once, a failure or
// loss that no client was told of. Past its deadline no write is
// acknowledged, and the parts with acknowledged writes that no flush
// covered (the deadline passed, or their flush failed) are named
// ([ErrUnflushed]).
//
// [Attach] dials the parts given as nbd:// URIs, builds the volume and serves
// it with an nbd.Server on a loopback TCP port or a Unix socket; [Serve] does
// the serving part for a Volume built with New. docs/composition.md explains
// the design, the choice of stripe unit and the failure behaviour.
//
// Zero values: a zero Volume, Attachment or Config is not usable on its own
// (Config's zero fields take defaults in New). Concurrency: Volume methods
// are safe for concurrent use, as long as the devices' are; Close may be
// called once, concurrently with I/O, which then fails.
package stripe
