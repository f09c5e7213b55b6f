// Package vm runs qemu guests whose disk is a lent block device: the VM
// borrowers of the Device Lending paper (Markussen et al., "Flexible device
// compositions and dynamic resource sharing in PCIe interconnected clusters
// using Device Lending"), which keep their devices when they are moved.
//
// Run boots a guest (qemu-system-x86_64, direct kernel boot, TCG or KVM)
// whose virtio disk is an NBD export on a Unix socket: a local attachment
// of the lease (borrower.Attach), which dials the lenders; qemu never
// dials a lender itself. The export name is a credential: the guest
// starts paused and the disk is added over QMP (blockdev-add), so it
// never shows in `ps`, and qemu's error messages are redacted. Run stops
// a guest cleanly when its context ends: the vCPUs pause, qemu flushes
// the disk (NBD_CMD_FLUSH, which the attachment passes to the lenders)
// and quits — the guest can then be started on another host with the
// same disk (cold migration, `rialto vm move`). ResolveAccel picks KVM
// only when a probe guest actually runs under it (ProbeKVM; nested KVM
// hangs on some hosts).
// Record and its helpers keep what `rialto vm` knows about a VM in a state
// dir. docs/vm.md is the user's guide.
//
// Zero values: Config and Record are plain data; a zero QMP is not usable
// (DialQMP). Concurrency: Run owns qemu and the goroutines it starts and
// waits for them before it returns; a QMP's methods are safe for
// concurrent use (commands run one at a time). The record helpers do no
// locking: one `rialto vm run` owns a VM's record at a time, the one that
// holds its Lock.
package vm
