// Package borrower is what a borrower does with a lease the control plane
// granted. For now it verifies a memory lease (Memtest), what `rialto
// memtest` runs.
//
// The package holds no state: its functions may be called concurrently.
package borrower
