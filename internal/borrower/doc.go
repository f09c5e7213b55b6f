// Package borrower is what a borrower does with a lease the control plane
// granted: attach a block lease (one part or composed) and serve it locally
// as one NBD export, following a part whose lender moved; attach a memory
// lease as a swap-style NBD export, dial its donor or map it into memory
// (the export, the mapping and Memtest following the lease when it moves),
// and verify it (Memtest); dial an accelerator lease's slot or its lender's
// batching gateway, and have a slot read and write ranges of block leases
// itself (BlockRange), or relay them through the borrower for comparison
// (RelayLoad, RelayStore); attach a NIC lease as a TUN interface, bonded
// over its lenders (AttachNIC). `rialto attach`, `rialto memtest` and
// `rialto accel run`
// are thin command-line wrappers over it; other programs can use it the
// same way.
//
// It takes leases as api.Lease values and asks the control plane for
// nothing but, through a LeaseSource (an *api.Client is one), the current
// record of a lease whose part moved. Lease URIs are parsed with the data
// planes' URI types (nbd.ParseURI, protocol.ParseURI, accel.ParseURI,
// nic.ParseURI);
// their credentials never reach an error message or a log line. URIs that
// ask for TLS (nbds://, rialto-mems://, rialto-accels://, rialto-nics://)
// are dialled with the client configuration the caller passes
// (AttachConfig.TLS, NICConfig.TLS and the like: normally
// pki.LoadClientTLS of the cluster CA's certificate; a NIC lease's
// lenders are refused without one); the others in plaintext, as the
// lease says. AttachConfig.TLS and NICConfig.TLS are functions an
// attachment calls at each dial of a block part, each follow of a memory
// lease and each dial of a NIC lease's lender (its redials included), so
// that a caller that follows a CA rotation (rialto attach: pki.Roots)
// verifies a lender renewed from the new CA.
//
// The package holds no state: its functions may be called concurrently.
// What they return (a *stripe.Attachment, a *client.Client, a
// *MemoryMapping, an *accel.Conn, a *nic.Interface) owns its connections and goroutines until
// its Close, and is safe for concurrent use as documented by its type.
package borrower
