// Package memory is Rialto's remote-memory data plane, after Dong et al.,
// "Venice: Exploring Server Architectures for Effective Resource Sharing".
// It holds no code; its subpackages do:
//
//   - protocol: the wire format (docs/memory-protocol.md) and the
//     rialto-mem:// URI of a memory lease;
//   - donor: the lender's side, which reserves one anonymous region per
//     lease and serves it;
//   - client: the borrower's session with a region, over Venice's three
//     channels (synchronous, bulk, queue pairs) and an adaptive choice
//     between them, and an NBD backend over it;
//   - mapping: a transparent mapping of a region, its pages fetched on
//     first touch by a userfaultfd fault handler process;
//   - uffd: the thin userfaultfd(2) wrapper the mapping uses;
//   - memorytest: donors for tests, in process or in a child process.
//
// Dependencies point one way: protocol ← donor, client ← mapping; the
// raw-syscall connection the client, the donor and the fault handler share
// is internal/rawconn.
package memory
